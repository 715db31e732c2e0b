"""The four CLI traps of issue 35: unknown LLMSIM_* variables, options around a subcommand,
a banner that says what the server is doing, and ``llmsim top`` over several servers."""

from __future__ import annotations

import io
import subprocess
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest

from llmsim.config import Config, ConfigWarning, load_config
from llmsim.ops import cli
from llmsim.ops.cli import banner, config_from_args, split_command
from llmsim.ops.top import render_many

from . import rawhttp

# -- 1. unknown LLMSIM_* variables warn ----------------------------------------------------

def test_unknown_env_var_warns_and_starts() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(env={"LLMSIM_URL": "http://x/v1", "LLMSIM_SEED": "4"})
    assert cfg.seed == 4
    msgs = [str(w.message) for w in caught if w.category is ConfigWarning]
    assert msgs == ["unknown environment variable LLMSIM_URL ignored"]  # no close match
    seen: list[str] = []
    load_config(env={"LLMSIM_BASE_URL": "x", "LLMSIM_SEEDS": "1",
                     "LLMSIM_FAULTS_P429": "0.1"}, warn=seen.append)
    assert seen == ["unknown environment variable LLMSIM_BASE_URL ignored",
                    "unknown environment variable LLMSIM_SEEDS ignored (did you mean "
                    "LLMSIM_SEED?)",
                    "unknown environment variable LLMSIM_FAULTS_P429 ignored (did you mean "
                    "LLMSIM_FAULTS_P_429?)"]


def test_typo_names_the_close_match() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        cfg, _ = config_from_args([], env={"LLMSIM_LATENSY": "instant"})
    assert cfg.latency == "realistic"  # ignored, not guessed
    assert "llmsim: warning: unknown environment variable LLMSIM_LATENSY ignored (did you " \
        "mean LLMSIM_LATENCY?)" in err.getvalue()


def test_cli_starts_with_a_client_side_variable_set() -> None:
    env = {"LLMSIM_URL": "http://127.0.0.1:1/v1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "llmsim", "--latency", "fast"],
                         capture_output=True, text=True, timeout=30, env=env)
    # start-up went past the environment (the bad flag is what stops it) and warned
    assert out.returncode == 2 and "invalid choice" in out.stderr
    out = subprocess.run([sys.executable, "-c", "import sys; from llmsim.ops.cli import "
                          "config_from_args as c; print(c(['--port', '0'])[0].port)"],
                         capture_output=True, text=True, timeout=30, env=env)
    assert out.returncode == 0 and out.stdout.strip() == "0"
    assert "unknown environment variable LLMSIM_URL ignored" in out.stderr


# -- 2. options before or after the subcommand ----------------------------------------------

@pytest.mark.parametrize("argv,command,rest", [
    (["--port", "9", "record", "--upstream", "http://u"], "record",
     ["--port", "9", "--upstream", "http://u"]),
    (["record", "--upstream", "http://u", "--port", "9"], "record",
     ["--upstream", "http://u", "--port", "9"]),
    (["--fixed-text", "top", "--port", "9"], None, ["--fixed-text", "top", "--port", "9"]),
    (["--fixed-text=top", "top", "--once"], "top", ["--fixed-text=top", "--once"]),
    (["--seed", "1"], None, ["--seed", "1"]),
])
def test_split_command(argv: list[str], command: str | None, rest: list[str]) -> None:
    assert split_command(argv) == (command, rest)


def test_global_options_before_record(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Config] = []

    def fake_run(coro: Any, cfg: Config) -> None:
        coro.close()
        seen.append(cfg)

    monkeypatch.setattr(cli, "run_loop", fake_run)
    for argv in (["--port", "0", "record", "--upstream", "http://127.0.0.1:9/"],
                 ["record", "--port", "0", "--upstream=http://127.0.0.1:9/"],
                 ["--port", "0", "--quiet", "record", "--upstream", "http://127.0.0.1:9/"]):
        assert cli.main(argv) == 0, argv
    assert [(c.port, c.record_upstream) for c in seen] == [(0, "http://127.0.0.1:9/")] * 3
    err = io.StringIO()
    with redirect_stderr(err):
        assert cli.main(["--port", "0", "record"]) == 2
    assert "record needs --upstream" in err.getvalue()


# -- 3. the banner says the mode, the state back end and the realism models ---------------

def test_banner_states_mode_state_and_realism(tmp_path: Any) -> None:
    plain = banner("http://h:1", Config())
    assert "mode: simulate" in plain and "state: in memory" in plain
    assert "realism: none" in plain and "max_tokens: natural" in plain
    rec = banner("http://h:1", Config(record_upstream="http://up:1", cassettes="c"))
    assert "mode: record (proxying http://up:1, cassettes in c)" in rec
    rep = banner("http://h:1", Config(replay="cass", replay_speed=2))
    assert "mode: replay (cassettes in cass, speed 2x)" in rep
    scr = banner("http://h:1", Config(script="s.json"))
    assert "mode: script (s.json" in scr
    red = banner("http://h:1", Config(state="redis://u:secret@r:6379/0"))
    assert "state: redis (redis://u:***@r:6379/0)" in red and "secret" not in red
    assert "shared on-disk store across 4 worker" in banner("http://h:1", Config(), 4)
    cfg = load_config(env={}, overrides={"faults.p_429": 0.1, "ratelimit.rpm": 60,
                                         "capacity.max_seqs": 8})
    real = banner("http://h:1", cfg)
    assert "faults (429 0.1)" in real and "rate limits (rpm 60" in real
    assert "capacity (max_seqs 8" in real


# -- 4. llmsim top over several servers -----------------------------------------------------

def test_top_several_urls(make_server: Any) -> None:
    a, b = make_server(latency="instant"), make_server(latency="instant")
    for s in (a, b, b):
        rawhttp.request(s.url, "POST", "/v1/chat/completions",
                        {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": 2})
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["top", a.url, "--url", b.url, "http://127.0.0.1:1", "--once"]) == 0
    text = out.getvalue()
    assert "3 servers (2 answering)" in text
    assert a.url in text and b.url in text and "http://127.0.0.1:1  cannot read" in text
    frame, failed = render_many(["u1", "u2"], fetch=lambda u: (_ for _ in ()).throw(
        OSError("down")))
    assert failed == 2 and "0 answering" in frame
    err = io.StringIO()
    with redirect_stderr(err):  # every server down: an error exit, as with one
        assert cli.main(["top", "http://127.0.0.1:1", "http://127.0.0.1:2", "--once"]) == 1
