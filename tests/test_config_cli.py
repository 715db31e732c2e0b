"""Config precedence (flags > env > file > defaults), unknown keys, CLI help and start-up."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time

import pytest

from llmsim.config import Config, ConfigError, iter_options, load_config
from llmsim.ops.cli import build_parser, config_from_args


def test_defaults():
    c = load_config(env={})
    assert (c.host, c.port, c.latency, c.seed, c.strict_models) == ("127.0.0.1", 8080,
                                                                    "realistic", None, False)


def test_precedence_flags_env_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('port = 1111\nseed = 1\nlatency = "instant"\nitl_ms = 5\n')
    env = {"LLMSIM_PORT": "2222", "LLMSIM_SEED": "2"}
    c, _ = config_from_args(["--config", str(f), "--port", "3333"], env=env)
    assert c.port == 3333  # flag beats env and file
    assert c.seed == 2  # env beats file
    assert c.latency == "instant" and c.itl_ms == 5.0  # file beats defaults


def test_env_bool_and_config_env_var(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("ttft_ms = 123\n")
    c, _ = config_from_args([], env={"LLMSIM_STRICT_MODELS": "true", "LLMSIM_CONFIG": str(f)})
    assert c.strict_models is True and c.ttft_ms == 123.0


def test_unknown_keys_are_errors(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("prot = 1\n")
    with pytest.raises(ConfigError, match="unknown config key 'prot'"):
        load_config(f, env={})
    f.write_text('[models."m"]\nctx = 5\n')
    with pytest.raises(ConfigError, match="models.m.ctx"):
        load_config(f, env={})
    seen: list[str] = []  # an unknown LLMSIM_* variable: a warning naming its close match
    assert load_config(env={"LLMSIM_PROT": "1"}, warn=seen.append).port == 8080
    assert seen == ["unknown environment variable LLMSIM_PROT ignored (did you mean "
                    "LLMSIM_PORT?)"]


@pytest.mark.parametrize("content,needle", [
    ("port = 'x'", "port"), ("latency = 'slow'", "latency"), ("port = 99999", "port"),
    ("tool_call_probability = 2", "tool_call_probability"), ("seed = 1.5", "seed"),
    ("this is not toml", "not valid TOML"),
    ("write_stall_timeout_s = -1", "write_stall_timeout_s"),
])
def test_bad_values_name_the_key(tmp_path, content, needle):
    f = tmp_path / "c.toml"
    f.write_text(content)
    with pytest.raises(ConfigError, match=needle):
        load_config(f, env={})


def test_models_from_file_extend_registry(tmp_path):
    from llmsim.sim.models import Registry

    f = tmp_path / "c.toml"
    f.write_text('[models."acme-1"]\ncontext_window = 4096\nttft_ms = 10\nreasoning = true\n')
    c = load_config(f, env={})
    reg = Registry(c.models)
    m = reg.get("acme-1")
    assert m.context_window == 4096 and m.ttft_ms == 10 and m.reasoning
    assert "acme-1" in [p.id for p in reg.listed()]


def test_every_option_has_help_flag_and_env():
    opts = iter_options()
    assert len(opts) >= 15
    text = build_parser().format_help()
    for o in opts:
        assert o.help, o.path
        assert o.flag in text, o.flag
        assert o.env in text, o.env


def test_config_is_frozen():
    c = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.port = 1  # type: ignore[misc]


def test_cli_help_and_bad_flag():
    out = subprocess.run([sys.executable, "-m", "llmsim", "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    for flag in ("--host", "--port", "--config", "--seed", "--latency", "--ttft-ms", "--itl-ms",
                 "--strict-models"):
        assert flag in out.stdout
    bad = subprocess.run([sys.executable, "-m", "llmsim", "--latency", "slow"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    env = {**os.environ, "LLMSIM_NOPE": "1", "LLMSIM_PORT": "99999"}
    bad = subprocess.run([sys.executable, "-m", "llmsim"], capture_output=True, text=True,
                         timeout=30, env=env)  # the unknown one warns, the bad value fails
    assert bad.returncode == 2 and "warning: unknown environment variable LLMSIM_NOPE" in \
        bad.stderr and "port" in bad.stderr


def test_start_prints_url_and_serves_then_sigterm():
    import signal
    import urllib.request

    p = subprocess.Popen([sys.executable, "-m", "llmsim", "--port", "0", "--latency", "instant"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = p.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, line
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(m.group(0) + "/health", timeout=5) as r:
                    assert r.status == 200
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        rest = "".join(p.stdout.readline() for _ in range(8))
        assert "mode: simulate" in rest and "state: in memory" in rest
        assert "curl" in line + rest or "OPENAI_BASE_URL" in rest
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()
        p.stderr.close()


@pytest.mark.parametrize("build, needle", [
    (lambda: Config(port=70000), "port: must be between 0 and 65535"),
    (lambda: Config(port="80"), "port: '80' is not a valid value (expected int)"),
    (lambda: Config(latency="fast"), "latency: 'fast' is not a valid value"),
    (lambda: Config().replace(tool_call_probability=3.0), "tool_call_probability"),
    (lambda: dataclasses.replace(Config().faults, p_429=3.0),
     "faults.p_429: must be between 0 and 1"),
    (lambda: dataclasses.replace(Config().capacity, reject_status=500),
     "capacity.reject_status: must be 429 or 503"),
    (lambda: dataclasses.replace(Config().websocket, max_lanes=0), "websocket.max_lanes"),
])
def test_config_built_in_code_is_validated(build, needle):
    """Config(...) in code (the README's embedding style) gets the same errors as the flags:
    ConfigError is a ValueError whose message names the field."""
    with pytest.raises(ValueError) as e:
        build()
    assert isinstance(e.value, ConfigError) and needle in str(e.value)


def test_same_rule_same_message_from_flag_env_and_code(tmp_path):
    with pytest.raises(ConfigError) as in_code:
        Config(port=70000)
    with pytest.raises(ConfigError) as from_env:
        load_config(env={"LLMSIM_PORT": "70000"})
    assert str(in_code.value) == str(from_env.value)
    bad = subprocess.run([sys.executable, "-m", "llmsim", "--port", "70000"],
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and str(in_code.value) in bad.stderr
