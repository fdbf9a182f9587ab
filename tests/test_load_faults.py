"""Server probe fault paths against a local stub (tests/stub_server.py): retries, one-line errors,
nothing completed lost or duplicated across --resume. No torch is needed on this path."""

import json
import os
import socket
import sys
from pathlib import Path

import pytest

from nondet.errors import RunDirError, ServerResponseError, ServerUnreachableError
from nondet.probes.core.load_config import LoadConfig
from nondet.probes.probe import DEFAULT_PROMPT, ProbeConfig, run_probe

sys.path.insert(0, str(Path(__file__).parent))
from stub_server import StubServer  # noqa: E402
import cli_runner


def server_config(url, out, runs=4, **load):
    load = {"mode": "server", "endpoint": url, "rate": 100.0, "timeout": 5.0, **load}
    return ProbeConfig(max_new_tokens=4, runs=runs, out=str(out), load=LoadConfig(**load))


def targets(stub):
    return [b for b in stub.received if b.get("prompt") == DEFAULT_PROMPT]


def lines(run_dir):
    return (Path(run_dir) / "streams.jsonl").read_text().splitlines()


def nondet(*args, env=None):
    return cli_runner.run(args, env={**os.environ, **(env or {})}, timeout=120)


def test_stub_probe_records_identity_levels_and_never_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("NONDET_TEST_KEY", "sk-very-secret-123")
    with StubServer() as stub:
        result = run_probe(server_config(stub.url, tmp_path / "r", api_key_env="NONDET_TEST_KEY"))
    m = result.summary["modes"]["default"]
    assert m["n_runs"] == 5 and m["distinct_completions"] == 1
    assert result.summary["load"]["compare_level"] == "logprobs"
    assert set(stub.auth) == {"Bearer sk-very-secret-123"}
    fp = json.loads((tmp_path / "r" / "fingerprint.json").read_text())
    assert fp["load"]["server"]["models"] == ["stub-model"] and fp["model"]["name"] == "stub-model"
    assert fp["load"]["server"]["headers"]["server"].startswith("nondet-stub/1.0")
    assert all(b["model"] == "stub-model" and b["temperature"] == 0 and b["logprobs"] == 5 for b in targets(stub))
    for f in (tmp_path / "r").iterdir():
        assert "sk-very-secret" not in f.read_text()


def test_5xx_is_retried_then_succeeds(tmp_path):
    failed = []
    with StubServer(fail_first=2) as stub:
        result = run_probe(server_config(stub.url, tmp_path / "r", runs=2, filler_requests=0),
                                  on_progress=lambda c: failed.append(c.failed))
    assert result.summary["modes"]["default"]["n_runs"] == 3
    assert max(failed) == 2 and len(lines(tmp_path / "r")) == 3


def test_persistent_500_is_one_line_exit_5(tmp_path):
    with StubServer(mode="500") as stub:
        r = nondet("probe", "--endpoint", stub.url, "--runs", "2", "--out", str(tmp_path / "r"), "--json")
    assert r.returncode == 5
    assert r.stderr.strip() == (f"nondet: error: {stub.url}/v1/completions answered HTTP 500: Internal Server Error "
                                f"(3 attempts); 0 completed answers are kept in {tmp_path / 'r'}: "
                                f"finish with `nondet probe --resume {tmp_path / 'r'}`")


def test_garbage_json_is_a_response_error(tmp_path):
    with StubServer(mode="garbage") as stub, pytest.raises(ServerResponseError, match="malformed JSON"):
        run_probe(server_config(stub.url, tmp_path / "r"))
    assert len(targets(stub)) == 1  # not retried


def test_hang_past_the_timeout_is_unreachable(tmp_path):
    with StubServer(mode="hang", hang_seconds=30) as stub, \
            pytest.raises(ServerUnreachableError, match=r"no answer within 0.3 s; the server hangs.*--resume"):
        run_probe(server_config(stub.url, tmp_path / "r", timeout=0.3))
    assert len(targets(stub)) == 1  # not resent: the server may still be working on it


def test_connection_refused_exit_3(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = nondet("probe", "--endpoint", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "r"))
    assert r.returncode == 3
    assert r.stderr.strip() == (f"nondet: error: cannot reach http://127.0.0.1:{port}/v1/models: connection "
                                "refused (3 attempts); is the server running?")
    assert not (tmp_path / "r").exists()


def test_dropped_connection_then_resume_loses_and_duplicates_nothing(tmp_path):
    run_dir = tmp_path / "r"
    with StubServer(drop_after=4) as stub:
        with pytest.raises(ServerUnreachableError, match="connection dropped.*--resume"):
            run_probe(server_config(stub.url, run_dir, runs=8, concurrency=2, filler_requests=0))
        before = lines(run_dir)
        assert len(before) == 4  # every answer that arrived is on disk
        sent_before = len(targets(stub))
        stub.drop_after = None
        r = nondet("probe", "--resume", str(run_dir), "--json")
    assert r.returncode == 0, r.stderr
    after = lines(run_dir)
    assert after[:4] == before  # completed answers untouched
    indices = [json.loads(x)["request_index"] for x in after]
    assert sorted(indices) == list(range(9))  # each request exactly once
    assert len(targets(stub)) - sent_before == 5  # only the missing ones were sent
    summary = json.loads(r.stdout)
    assert summary["modes"]["default"]["n_runs"] == 9 and summary["run_dir"] == str(run_dir)


def test_resume_of_a_static_run_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"command": "probe", "config": {"load": {"mode": "static"}}}))
    with pytest.raises(RunDirError, match="not a server probe"):
        run_probe(ProbeConfig(load=LoadConfig(mode="server", resume=str(tmp_path))))


def test_the_model_that_answered_is_kept_and_named_where_it_is_not_the_listed_one(tmp_path):
    """An alias answered by a dated snapshot, or a llama.cpp server answering with whatever it loaded: the answer's
    `model` was recorded nowhere. Now in fingerprint.json (load.server.answered_model) and each stream, and one warning
    line where it is not the listed model. Control: a server answering as the model it lists warns nothing."""
    for answered, warns in (("other-model-v2", True), ("stub-model", False)):
        out = tmp_path / answered
        with StubServer(answered_model=answered) as stub:
            r = nondet("probe", "--endpoint", stub.url, "--runs", "2", "--out", str(out))
        assert r.returncode == 0, r.stderr
        said = [line for line in r.stderr.splitlines() if line.startswith("nondet: warning:")]
        assert said == ([f"nondet: warning: the server answered as model '{answered}', not 'stub-model' as listed; "
                         "fingerprint.json keeps both"] if warns else [])
        fingerprint = json.loads((out / "fingerprint.json").read_text())
        assert fingerprint["load"]["server"]["answered_model"] == answered
        streams = [json.loads(line) for line in (out / "streams.jsonl").read_text().splitlines()]
        assert {s["answered_model"] for s in streams} == {answered}
