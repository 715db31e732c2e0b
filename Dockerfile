# llmsim container image: slim Python, non-root, `python -m llmsim` as the entrypoint.
#   docker build -t llmsim .               # runtime deps + the redis client (--state redis://)
#   docker build --build-arg EXTRAS=fast,redis,tokens -t llmsim .   # + uvloop, exact tokenizer
#   docker build --build-arg EXTRAS= -t llmsim .   # runtime deps only (h11, wsproto, orjson)
#   docker run -p 8080:8080 llmsim --latency instant --seed 1
ARG PYTHON=3.12-slim

FROM python:${PYTHON} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY llmsim ./llmsim
ARG EXTRAS="redis"
RUN pip install --no-cache-dir --prefix=/install ".${EXTRAS:+[$EXTRAS]}"

FROM python:${PYTHON}
COPY --from=build /install /usr/local
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin llmsim
USER 10001
# inside a container the server listens on every interface (the CLI default is 127.0.0.1)
ENV LLMSIM_HOST=0.0.0.0 \
    LLMSIM_PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('LLMSIM_PORT', '8080') + '/health', timeout=2)"]
ENTRYPOINT ["python", "-m", "llmsim"]
