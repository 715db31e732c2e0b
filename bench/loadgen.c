/* llmsim bench load generator: one epoll thread, non-blocking sockets, loopback only.
 *
 * It must be faster than the server it measures, so it does the least work per byte: HTTP
 * heads are scanned for Content-Length / chunked / status, chunked bodies are decoded by a
 * byte state machine, SSE events are split on the blank line, WebSocket frames by their
 * header. Every token event is timestamped (CLOCK_MONOTONIC) when read() returns.
 *
 * Modes (all print one JSON object on stdout):
 *   rps     -c CONNS -d SECONDS -f REQFILE
 *           keep-alive request loop: requests/s and latency percentiles.
 *   stream  -c CONNS -d SECONDS -f REQFILE -t TTFT_MS -i ITL_MS -m MARKER [-r RAMP_S]
 *           [-w WSFRAMEFILE -e ENDMARKER]
 *           each connection runs streams back to back until SECONDS have passed (starts are
 *           spread over RAMP_S). Token events are the events containing MARKER; the j-th token
 *           is scheduled at send + TTFT + j*ITL. Reports TTFT error, inter-token gap error and
 *           lateness (actual - scheduled) p50/p99/max, and the share of tokens on time.
 *           With -w the request is an HTTP upgrade, then WSFRAMEFILE's bytes are sent as one
 *           masked text frame per stream; a frame containing ENDMARKER ends a stream.
 *   hold    -c CONNS -f REQFILE [-s]: open CONNS connections, send one request on each; when
 *           every response is complete (or, with -s, every stream has started) print a READY
 *           line on stderr, keep reading, and exit when stdin reaches EOF.
 *
 * Build: gcc -O2 -o loadgen loadgen.c -lm
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { S_WAIT, S_CONNECTING, S_HEAD, S_BODY, S_WS, S_IDLE, S_DONE };
enum { B_LEN, B_CHUNK_SIZE, B_CHUNK_DATA, B_CHUNK_CRLF, B_CHUNK_TRAILER, B_EOF };

typedef struct {
    double *v;
    size_t n, cap;
} vec;

static void push(vec *a, double x) {
    if (a->n == a->cap) {
        a->cap = a->cap ? a->cap * 2 : 4096;
        a->v = realloc(a->v, a->cap * sizeof(double));
        if (!a->v) { perror("realloc"); exit(3); }
    }
    a->v[a->n++] = x;
}

typedef struct {
    int fd, state, idx;
    double start_at, t_send;
    size_t sent;             /* bytes of the current request already written */
    const char *out; size_t outlen;
    char head[16384]; size_t hlen;
    int status, bmode;
    long remaining;          /* content-length left or chunk bytes left */
    char sizebuf[32]; int slen;
    int trailer_nl;          /* trailer state: count of consecutive CRLF-ish */
    /* SSE */
    char ev[640]; int evlen; char prev;
    /* WS */
    unsigned char wsh[14]; int wshlen; long wsleft; int wsop; int ws_upgraded;
    /* per-stream timing */
    int ntok; double last_tok; int started; int ended_by_marker;
} conn;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static char *readfile(const char *p, size_t *len) {
    FILE *f = fopen(p, "rb");
    if (!f) { perror(p); exit(2); }
    fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (fread(b, 1, n, f) != (size_t)n) { perror("read"); exit(2); }
    b[n] = 0; fclose(f); *len = n; return b;
}

/* ---- globals ---------------------------------------------------------------------------- */
static const char *mode = "rps";
static int nconns = 64, port = 0, hold_stream = 0, use_ws = 0;
static double duration = 5, ttft = 0, itl = 0, ramp = 0;
static const char *marker = NULL, *endmarker = NULL;
static char *req; static size_t reqlen;
static char *wsframe; static size_t wsframelen;
static int ep;
static conn *conns;
static double t_begin, t_end;
static long completed = 0, errors = 0, events = 0, tokens = 0, streams_started = 0;
static long bytes_in = 0, tok_late2 = 0, tok_late5 = 0, live = 0, ready_count = 0;
static vec lat, ttft_err, gap_err, abs_gap_err, late;
static int printed_ready = 0;

static void ws_build_frame(const char *payload, size_t n) {
    /* masked client text frame */
    size_t hl = n < 126 ? 2 : (n < 65536 ? 4 : 10);
    wsframe = malloc(hl + 4 + n);
    unsigned char *f = (unsigned char *)wsframe;
    f[0] = 0x81;
    if (n < 126) f[1] = 0x80 | n;
    else if (n < 65536) { f[1] = 0x80 | 126; f[2] = n >> 8; f[3] = n & 255; }
    else { f[1] = 0x80 | 127; for (int i = 0; i < 8; i++) f[2 + i] = (uint64_t)n >> (56 - 8 * i); }
    unsigned char mask[4] = {0x12, 0x34, 0x56, 0x78};
    memcpy(f + hl, mask, 4);
    for (size_t i = 0; i < n; i++) f[hl + 4 + i] = payload[i] ^ mask[i & 3];
    wsframelen = hl + 4 + n;
}

static void arm(conn *c, uint32_t evs) {
    struct epoll_event e = {.events = evs, .data.ptr = c};
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e) < 0) epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e);
}

static void close_conn(conn *c, int err) {
    if (c->fd >= 0) { epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL); close(c->fd); c->fd = -1; live--; }
    if (err) errors++;
    c->state = S_DONE;
}

static void flush_out(conn *c) {
    while (c->sent < c->outlen) {
        ssize_t w = write(c->fd, c->out + c->sent, c->outlen - c->sent);
        if (w < 0) {
            if (errno == EAGAIN) { arm(c, EPOLLIN | EPOLLOUT); return; }
            close_conn(c, 1); return;
        }
        c->sent += w;
    }
    arm(c, EPOLLIN);
}

static void reset_response(conn *c) {
    c->hlen = 0; c->status = 0; c->bmode = B_LEN; c->remaining = 0; c->slen = 0;
    c->evlen = 0; c->prev = 0; c->ntok = 0; c->started = 0; c->trailer_nl = 0;
    c->wshlen = 0; c->wsleft = -1; c->ended_by_marker = 0;
}

static void send_request(conn *c) {
    reset_response(c);
    c->t_send = now();
    c->sent = 0;
    if (use_ws && c->ws_upgraded) { c->out = wsframe; c->outlen = wsframelen; c->state = S_WS; }
    else { c->out = req; c->outlen = reqlen; c->state = S_HEAD; }
    streams_started++;
    flush_out(c);
}

static void start_conn(conn *c) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0) { perror("socket"); errors++; c->state = S_DONE; return; }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    c->fd = fd; live++;
    int r = connect(fd, (struct sockaddr *)&a, sizeof a);
    if (r < 0 && errno != EINPROGRESS) { close_conn(c, 1); return; }
    c->state = S_CONNECTING;
    c->ws_upgraded = 0;
    struct epoll_event e = {.events = EPOLLOUT, .data.ptr = c};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
}

/* ---- per-stream bookkeeping ------------------------------------------------------------- */
static void on_event(conn *c, const char *p, int n, double t) {
    events++;
    if (!c->started) { c->started = 1; }
    if (marker && memmem(p, n, marker, strlen(marker))) {
        double sched = c->t_send + ttft + c->ntok * itl;
        double l = t - sched;
        push(&late, l * 1e3);
        if (l <= 0.002) tok_late2++;
        if (l <= 0.005) tok_late5++;
        if (c->ntok == 0) push(&ttft_err, (t - c->t_send - ttft) * 1e3);
        else { push(&gap_err, (t - c->last_tok - itl) * 1e3);
               push(&abs_gap_err, fabs(t - c->last_tok - itl) * 1e3); }
        c->last_tok = t; c->ntok++; tokens++;
    }
    if (endmarker && memmem(p, n, endmarker, strlen(endmarker))) c->ended_by_marker = 1;
}

static void sse_bytes(conn *c, const char *p, size_t n, double t) {
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (c->evlen < (int)sizeof c->ev) c->ev[c->evlen++] = ch;
        if (ch == '\n' && c->prev == '\n') {
            on_event(c, c->ev, c->evlen, t);
            c->evlen = 0; ch = 0;
        }
        c->prev = ch;
    }
}

static void response_done(conn *c, double t) {
    completed++;
    if (!strcmp(mode, "rps")) push(&lat, (t - c->t_send) * 1e3);
    if (!strcmp(mode, "hold")) {
        c->state = S_IDLE; ready_count++;
        return;
    }
    if (t < t_end) send_request(c);
    else close_conn(c, 0);
}

/* parse the response head; returns bytes consumed from head buffer end (body start) or -1 */
static int parse_head(conn *c) {
    char *e = memmem(c->head, c->hlen, "\r\n\r\n", 4);
    if (!e) return -1;
    size_t hend = e - c->head + 4;
    c->status = atoi(c->head + 9);
    c->bmode = B_EOF; c->remaining = 0;
    char *line = c->head;
    while (line < c->head + hend) {
        char *nl = memmem(line, c->head + hend - line, "\r\n", 2);
        if (!nl) break;
        if (!strncasecmp(line, "content-length:", 15)) {
            c->bmode = B_LEN; c->remaining = atol(line + 15);
        } else if (!strncasecmp(line, "transfer-encoding:", 18) && memmem(line, nl - line, "chunked", 7)) {
            c->bmode = B_CHUNK_SIZE; c->slen = 0;
        }
        line = nl + 2;
    }
    if (c->status == 101) c->bmode = -1;
    return (int)hend;
}

static void body_bytes(conn *c, const char *p, size_t n, double t);

static void ws_bytes(conn *c, const unsigned char *p, size_t n, double t) {
    size_t i = 0;
    while (i < n) {
        if (c->wsleft < 0) {  /* reading a header */
            c->wsh[c->wshlen++] = p[i++];
            if (c->wshlen >= 2) {
                int len7 = c->wsh[1] & 127;
                int need = 2 + (len7 == 126 ? 2 : len7 == 127 ? 8 : 0);
                if (c->wshlen == need) {
                    long L = len7;
                    if (len7 == 126) L = (c->wsh[2] << 8) | c->wsh[3];
                    else if (len7 == 127) { L = 0; for (int k = 0; k < 8; k++) L = (L << 8) | c->wsh[2 + k]; }
                    c->wsop = c->wsh[0] & 15;
                    c->wsleft = L; c->wshlen = 0; c->evlen = 0;
                    if (L == 0) goto frame_end;
                }
            }
            continue;
        }
        {
            size_t take = n - i < (size_t)c->wsleft ? n - i : (size_t)c->wsleft;
            size_t room = sizeof c->ev - c->evlen;
            memcpy(c->ev + c->evlen, p + i, take < room ? take : room);
            c->evlen += take < room ? take : room;
            i += take; c->wsleft -= take;
            if (c->wsleft > 0) continue;
        }
    frame_end:
        c->wsleft = -1;
        if (c->wsop == 8) { close_conn(c, 1); return; }
        if (c->wsop == 1 || c->wsop == 0) {
            on_event(c, c->ev, c->evlen, t);
            if (c->ended_by_marker) {
                response_done(c, t);
                if (c->state == S_DONE) return;
            }
        }
    }
}

static void head_bytes(conn *c, const char *p, size_t n, double t) {
    size_t room = sizeof c->head - c->hlen;
    size_t take = n < room ? n : room;
    memcpy(c->head + c->hlen, p, take);
    size_t old = c->hlen;
    c->hlen += take;
    int hend = parse_head(c);
    if (hend < 0) {
        if (c->hlen == sizeof c->head) close_conn(c, 1);
        return;
    }
    size_t used = hend - old;  /* bytes of p that belonged to the head */
    if (c->status == 101) {
        c->ws_upgraded = 1;
        c->out = wsframe; c->outlen = wsframelen; c->sent = 0; c->state = S_WS;
        c->wsleft = -1; c->wshlen = 0;
        flush_out(c);
        if (n > used) ws_bytes(c, (const unsigned char *)p + used, n - used, t);
        return;
    }
    if (c->status != 200) errors++;
    c->state = S_BODY;
    if (c->bmode == B_LEN && c->remaining == 0) { response_done(c, t); return; }
    if (n > used) body_bytes(c, p + used, n - used, t);
}

static void body_bytes(conn *c, const char *p, size_t n, double t) {
    size_t i = 0;
    while (i < n && c->state == S_BODY) {
        switch (c->bmode) {
        case B_LEN: {
            size_t take = n - i < (size_t)c->remaining ? n - i : (size_t)c->remaining;
            if (marker) sse_bytes(c, p + i, take, t);
            i += take; c->remaining -= take;
            if (c->remaining == 0) { response_done(c, t); return; }
            break;
        }
        case B_EOF:
            if (marker) sse_bytes(c, p + i, n - i, t);
            i = n;
            break;
        case B_CHUNK_SIZE: {
            char ch = p[i++];
            if (ch == '\n') {
                c->sizebuf[c->slen] = 0;
                c->remaining = strtol(c->sizebuf, NULL, 16);
                c->slen = 0;
                if (c->remaining == 0) { c->bmode = B_CHUNK_TRAILER; c->trailer_nl = 0; }
                else c->bmode = B_CHUNK_DATA;
            } else if (ch != '\r' && c->slen < 30) c->sizebuf[c->slen++] = ch;
            break;
        }
        case B_CHUNK_DATA: {
            size_t take = n - i < (size_t)c->remaining ? n - i : (size_t)c->remaining;
            if (marker) sse_bytes(c, p + i, take, t);
            i += take; c->remaining -= take;
            if (c->remaining == 0) { c->bmode = B_CHUNK_CRLF; c->slen = 0; }
            break;
        }
        case B_CHUNK_CRLF:
            if (p[i++] == '\n') c->bmode = B_CHUNK_SIZE;
            break;
        case B_CHUNK_TRAILER: {
            /* after "0\r\n": an empty line ends the message */
            char ch = p[i++];
            if (ch == '\n') {
                if (c->trailer_nl == 0) { response_done(c, t); return; }
                c->trailer_nl = 0;
            } else if (ch != '\r') c->trailer_nl = 1;
            break;
        }
        }
    }
}

static void on_readable(conn *c) {
    char buf[65536];
    for (;;) {
        ssize_t r = read(c->fd, buf, sizeof buf);
        double t = now();
        if (r < 0) {
            if (errno == EAGAIN) return;
            close_conn(c, c->state != S_IDLE); return;
        }
        if (r == 0) {
            if (c->state == S_BODY && c->bmode == B_EOF) { response_done(c, t); if (c->state != S_DONE) close_conn(c, 0); return; }
            close_conn(c, c->state != S_IDLE && c->state != S_DONE);
            return;
        }
        bytes_in += r;
        if (c->state == S_HEAD) head_bytes(c, buf, r, t);
        else if (c->state == S_BODY) body_bytes(c, buf, r, t);
        else if (c->state == S_WS) ws_bytes(c, (unsigned char *)buf, r, t);
        if (c->state == S_DONE) return;
        if (hold_stream && !strcmp(mode, "hold") && c->started == 1) { c->started = 2; ready_count++; }
        if (r < (ssize_t)sizeof buf) return;
    }
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void pstats(const char *name, vec *a, int comma) {
    if (a->n == 0) { printf("\"%s\":null%s", name, comma ? "," : ""); return; }
    qsort(a->v, a->n, sizeof(double), cmpd);
    double p50 = a->v[(size_t)(0.50 * (a->n - 1))], p99 = a->v[(size_t)(0.99 * (a->n - 1))];
    double p999 = a->v[(size_t)(0.999 * (a->n - 1))];
    double mx = a->v[a->n - 1], mn = a->v[0];
    printf("\"%s\":{\"n\":%zu,\"min\":%.3f,\"p50\":%.3f,\"p99\":%.3f,\"p999\":%.3f,\"max\":%.3f}%s",
           name, a->n, mn, p50, p99, p999, mx, comma ? "," : "");
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: loadgen rps|stream|hold -p PORT ...\n"); return 2; }
    mode = argv[1];
    const char *reqfile = NULL, *wsfile = NULL;
    int opt;
    optind = 2;
    while ((opt = getopt(argc, argv, "p:c:d:f:t:i:m:r:w:e:s")) != -1) {
        switch (opt) {
        case 'p': port = atoi(optarg); break;
        case 'c': nconns = atoi(optarg); break;
        case 'd': duration = atof(optarg); break;
        case 'f': reqfile = optarg; break;
        case 't': ttft = atof(optarg) / 1e3; break;
        case 'i': itl = atof(optarg) / 1e3; break;
        case 'm': marker = optarg; break;
        case 'r': ramp = atof(optarg); break;
        case 'w': wsfile = optarg; use_ws = 1; break;
        case 'e': endmarker = optarg; break;
        case 's': hold_stream = 1; break;
        default: return 2;
        }
    }
    if (!port || !reqfile) { fprintf(stderr, "need -p PORT -f REQFILE\n"); return 2; }
    req = readfile(reqfile, &reqlen);
    if (use_ws) { size_t n; char *pl = readfile(wsfile, &n); ws_build_frame(pl, n); }
    ep = epoll_create1(0);
    conns = calloc(nconns, sizeof(conn));
    t_begin = now();
    t_end = t_begin + duration;
    for (int i = 0; i < nconns; i++) {
        conns[i].fd = -1; conns[i].idx = i; conns[i].state = S_WAIT;
        conns[i].start_at = t_begin + (nconns > 1 ? ramp * i / nconns : 0);
    }
    int next_start = 0;
    struct epoll_event evs[1024];
    int hold = !strcmp(mode, "hold");
    double hard_stop = t_end + 60;  /* streams in flight get a minute to finish */
    for (;;) {
        double t = now();
        while (next_start < nconns && conns[next_start].start_at <= t) start_conn(&conns[next_start++]);
        if (hold && !printed_ready && next_start == nconns && ready_count + errors >= nconns) {
            fprintf(stderr, "READY %ld %ld\n", ready_count, errors);
            fflush(stderr);
            printed_ready = 1;
        }
        if (!hold && next_start == nconns && live == 0) break;
        if (!hold && t > hard_stop) break;
        int timeout = 50;
        if (next_start < nconns) {
            double dt = conns[next_start].start_at - t;
            timeout = dt <= 0 ? 0 : (int)(dt * 1e3) + 0;
            if (timeout > 50) timeout = 50;
        }
        if (hold && printed_ready) {
            struct pollfd pf = {.fd = 0, .events = POLLIN};
            if (poll(&pf, 1, 0) > 0) {
                char b[64];
                if (read(0, b, sizeof b) <= 0) break;
            }
        }
        int n = epoll_wait(ep, evs, 1024, timeout);
        for (int k = 0; k < n; k++) {
            conn *c = evs[k].data.ptr;
            if (c->fd < 0) continue;
            if (c->state == S_CONNECTING) {
                int err = 0; socklen_t el = sizeof err;
                getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &el);
                if (err) { close_conn(c, 1); continue; }
                send_request(c);
                continue;
            }
            if ((evs[k].events & EPOLLOUT) && c->sent < c->outlen) flush_out(c);
            if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) on_readable(c);
        }
    }
    double elapsed = now() - t_begin;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec + ru.ru_stime.tv_usec * 1e-6;
    printf("{\"mode\":\"%s\",\"conns\":%d,\"elapsed_s\":%.3f,\"client_cpu_s\":%.3f,"
           "\"completed\":%ld,\"errors\":%ld,\"events\":%ld,\"tokens\":%ld,\"bytes_in\":%ld,"
           "\"streams_started\":%ld,\"tokens_on_time_2ms\":%ld,\"tokens_on_time_5ms\":%ld,",
           mode, nconns, elapsed, cpu, completed, errors, events, tokens, bytes_in,
           streams_started, tok_late2, tok_late5);
    pstats("latency_ms", &lat, 1);
    pstats("ttft_err_ms", &ttft_err, 1);
    pstats("gap_err_ms", &gap_err, 1);
    pstats("abs_gap_err_ms", &abs_gap_err, 1);
    pstats("lateness_ms", &late, 0);
    printf("}\n");
    return 0;
}
