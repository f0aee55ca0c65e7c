"""The efficacy protocol: its files are checked configs (a bad key is one line and exit 2), the
streams and orders it fixes, its clustered tables and targets, the ledger (appended, never
edited), and the bench running a test protocol end to end on a tiny model: every row on every
order, the stream files, the tables, and the ledger's start and end rows."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mia.errors import MiaError
from mia.eval.ledger import HEADER, LedgerRow, append_row, earlier_looks, read_rows
from mia.eval.protocol import load_protocol, ordered, protocol_stream
from mia.eval.protocol_stats import Question, evaluate_targets, scope_table, short_result

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "efficacy_bench.py"

TINY = """\
version: 1
worlds: [{seed}]
size: small
split: test
stream:
  conventions: 2
  standard: 2
orders: [file, shuffled]
precision: float32
judge: rule
rows:
  none: {{policy: none}}
  mia: {{policy: mia}}
  feedback: {{policy: feedback}}
  ttrl: {{ttrl: supervised}}
  ttrl_lr0: {{ttrl: supervised, overrides: [ttrl.lr=0]}}
baselines: [mem0]
clusters: world_template
targets:
  - {{name: convention_gain, metric: mia - none, on: convention, at_least: 0.10, interval_above: 0}}
  - {{name: no_kind_hurt, metric: mia - none, on: each_type, at_least: -0.01}}
  - {{name: ttrl_learns, metric: ttrl - ttrl_lr0, on: all, at_least: 0.03, interval_above: 0}}
"""


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_shipped_protocols_load() -> None:
    test = load_protocol(ROOT / "configs" / "efficacy" / "protocol.yaml")
    dev = load_protocol(ROOT / "configs" / "efficacy" / "dev.yaml")
    assert (test.kind, test.worlds, dev.kind, dev.worlds) == (
        "test", [20000, 20001, 20002], "dev", [10000, 10001, 10002],
    )  # fmt: skip
    for p in (test, dev):
        assert list(p.rows) == [
            "none", "mia", "feedback", "mia_no_expected", "mia_wrong_expected", "mia_nogt",
            "rag", "ttrl", "ttrl_lr0",
        ]  # fmt: skip
        assert p.rows["ttrl_lr0"].ttrl == "supervised" and p.rows["ttrl_lr0"].overrides == [
            "ttrl.lr=0"
        ]
        assert p.rows["mia_nogt"].overrides == ["eval.memory.ground_truth=false"]
        # `on:` stays a key (YAML 1.1 would read it as the boolean true)
        assert [(t.name, t.on) for t in p.targets] == [
            ("convention_gain", "convention"), ("no_kind_hurt", "each_type"),
            ("beats_feedback", "convention"), ("ttrl_learns", "all"),
        ]  # fmt: skip
        assert (p.stream.conventions, p.stream.standard, p.orders) == (
            "all",
            24,
            ["file", "shuffled"],
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("judge: rule", "judge: rule\nextra: 1"), r"unknown key\(s\) \['extra'\]"),
        (("judge: rule\n", ""), r"missing key\(s\) \['judge'\]"),
        (
            ("{policy: mia}", "{policy: mia, overides: []}"),
            r"rows\.mia: unknown key\(s\) \['overides'\]",
        ),
        (("{policy: feedback}", "{policy: feedbak}"), r"rows\.feedback: unknown policy 'feedbak'"),
        (("{policy: none}", "{policy: none, ttrl: nogt}"), r"rows\.none: give exactly one"),
        (("ttrl.lr=0", "eval.limit=3"), r"rows\.ttrl_lr0: eval\.limit is the protocol's to fix"),
        (("ttrl.lr=0", "agent.max_turns=2"), r"rows\.ttrl_lr0: override 'agent\.max_turns=2'"),
        (("worlds: [20000]", "worlds: [20000, 10000]"), r"must all be dev seeds or all test seeds"),
        (
            ("worlds: [20000]", "worlds: [5]"),
            r"must all be dev seeds or all test seeds, not \['legacy'\]",
        ),
        (("mia - none, on: convention", "mia - rag, on: convention"), r"metric must be"),
        (("on: each_type", "on: sideways"), r"on must be one of"),
        (("orders: [file, shuffled]", "orders: [file, backwards]"), r"orders must be"),
        (("conventions: 2", "conventions: some"), r"stream\.conventions must be all"),
    ],
)
def test_a_bad_protocol_is_one_line(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    text = TINY.format(seed=20000)
    assert change[0] in text
    path = _write(tmp_path / "p.yaml", text.replace(change[0], change[1], 1))
    with pytest.raises(MiaError, match=message) as err:
        load_protocol(path)
    assert str(err.value).startswith(f"protocol {path}: ") and "\n" not in str(err.value)


def _bench(*args: str, home: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MIA_EVAL_FAULT"}
    if home is not None:
        env["MIA_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_the_bench_refuses_a_bad_protocol_with_exit_2(tmp_path: Path) -> None:
    bad = _write(tmp_path / "p.yaml", TINY.format(seed=20000).replace("size: small", "sise: small"))
    r = _bench("--protocol", str(bad), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == [f"efficacy_bench: protocol {bad}: missing key(s) ['size'] "
                                     "(a protocol states every key)"]  # fmt: skip
    # A test protocol runs as fixed: fewer questions, bf16 or overrides are refused up front.
    good = _write(tmp_path / "t.yaml", TINY.format(seed=20000))
    ledger = _write(tmp_path / "ledger.md", (ROOT / "docs" / "ledger.md").read_text())
    for extra in (["--questions", "2"], ["--", "agent.max_turns=2"], ["--bf16"]):
        r = _bench("--protocol", str(good), "--ledger", str(ledger), "--out",
                   str(tmp_path / "o"), *extra)  # fmt: skip
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "test protocol" in r.stderr
    assert ledger.read_text() == (ROOT / "docs" / "ledger.md").read_text()


def test_streams_and_orders(tmp_path: Path) -> None:
    from mia.data.formats import load_qa
    from mia.data.world import World

    World.generate(seed=20000, size="small").write(tmp_path / "w")
    items = load_qa(tmp_path / "w" / "test.jsonl")
    # every convention question and the first 3 standard ones, in file order (images left out)
    stream = protocol_stream(items, "all", 3)
    assert [it.id.removeprefix("w20000_test_000") for it in stream] == [
        "00", "01", "02", "03", "05", "07", "10", "18",
    ]  # fmt: skip
    shuffled = ordered(stream, "shuffled", 20000)
    assert [it.id.removeprefix("w20000_test_000") for it in shuffled] == [
        "03", "10", "07", "01", "00", "02", "18", "05",
    ]  # fmt: skip
    assert ordered(stream, "file", 20000) == stream
    assert [it.id for it in ordered(stream, "shuffled", 20001)] != [it.id for it in shuffled]
    assert [it.id for it in protocol_stream(items, 2, 2)] == [
        "w20000_test_00000", "w20000_test_00001", "w20000_test_00002", "w20000_test_00005",
    ]  # fmt: skip


def _questions() -> list[Question]:
    """Two worlds x two orders; conventions in two templates per world, bridges in one."""
    qs = []
    for world in (1, 2):
        for order in ("file", "shuffled"):
            for i, (kind, qtype, template) in enumerate(
                [("convention", "convention", "c.a"), ("convention", "convention", "c.a"),
                 ("convention", "convention", "c.b"), ("standard", "bridge", "x>y")]
            ):  # fmt: skip
                qs.append(Question(world, order, f"q{i}", kind, qtype, template))
    return qs


def test_clustered_tables_and_targets() -> None:
    from mia.eval.protocol import TargetSpec

    qs = _questions()
    # none right on nothing; mia right on every convention question of world 1 and on q0 of
    # world 2; both right on the bridge question of world 2 only.
    none = {q.key: float(q.world == 2 and q.type == "bridge") for q in qs}
    mia = {q.key: float(q.kind == "convention" and (q.world == 1 or q.id == "q0")) for q in qs}
    mia.update({q.key: none[q.key] for q in qs if q.type == "bridge"})
    outcomes = {"none": none, "mia": mia}
    table = scope_table(outcomes, qs, "convention", ["none", "mia"])
    assert (table["questions"], table["clusters"]) == (12, 4)  # (world, template) pairs
    by = {r["row"]: r for r in table["rows"]}
    assert by["none"]["mean"] == 0.0 and by["none"]["ci"] == [0.0, 0.0]
    assert math.isclose(by["mia"]["mean"], 8 / 12) and by["mia"]["clusters"] == 4
    d = by["mia"]["vs"]["none"]
    assert math.isclose(d["mean"], 8 / 12) and d["n"] == 12
    assert 0.0 <= d["ci"][0] < 8 / 12 < d["ci"][1] <= 1.0
    assert "vs" in by["none"] and by["none"]["vs"]["mia"]["mean"] == -d["mean"]
    targets = [
        TargetSpec("gain", "mia - none", "convention", at_least=0.10, interval_above=0.0),
        TargetSpec("hurt", "mia - none", "each_type", at_least=-0.01),
        TargetSpec("big", "mia - none", "all", above=0.9),
    ]
    results = evaluate_targets(targets, outcomes, qs)
    assert [r["met"] for r in results] == [d["ci"][0] > 0, True, False]
    assert results[1]["worst"] == "bridge" and results[1]["differences"]["bridge"]["mean"] == 0.0
    assert results[2]["line"].startswith("big: mia - none on all = +50.0 points [")
    assert results[2]["line"].endswith("needs > +90.0: MISSED")
    assert short_result(results) == (
        f"gain +66.7 {'met' if results[0]['met'] else 'missed'}; hurt +0.0 met; big +50.0 missed"
    )


def test_an_interrupted_ttrl_pass_starts_again(tmp_path: Path) -> None:
    """The protocol's TTRL passes keep no Planner checkpoint, so a resumed run never continues
    one from its journal (it would keep the memories of the finished batches and lose the
    Planner's updates): the partial pass is removed and the row runs it again."""
    from mia.apps.demo_config import TTRLChoice
    from mia.apps.protocol import discard_partial_pass

    assert "trainer.save_freq=-1" in TTRLChoice().overrides
    run = tmp_path / "file" / "ttrl" / "ttrl"
    (run / "ttrl_state").mkdir(parents=True)
    (run / "ttrl_state" / "journal.json").write_text('{"next_batch": 3}')
    (run / "accuracy.jsonl").write_text("{}\n")
    assert discard_partial_pass(run) is True
    assert not run.exists() and (tmp_path / "file" / "ttrl").is_dir()
    assert discard_partial_pass(run) is False


def test_ledger_rows_are_appended_and_nothing_else_changes(tmp_path: Path) -> None:
    ledger = _write(tmp_path / "ledger.md", (ROOT / "docs" / "ledger.md").read_text())
    before = ledger.read_text()
    row = LedgerRow("r1", "2026-01-01 00:00:00", "abc+dirty", "p.yaml v1", "k1, k2",
                    "`python bench/efficacy_bench.py --protocol p.yaml`", "started", "-")  # fmt: skip
    append_row(ledger, row)
    end = dataclasses.replace(row, event="finished", result="gain +1.0 met | odd")
    append_row(ledger, end)
    text = ledger.read_text()
    assert text.startswith(before) and text.count("\n") == before.count("\n") + 2
    assert text.splitlines()[-2:] == [
        "| r1 | 2026-01-01 00:00:00 | abc+dirty | p.yaml v1 | k1, k2 | "
        "`python bench/efficacy_bench.py --protocol p.yaml` | started | - |",
        "| r1 | 2026-01-01 00:00:00 | abc+dirty | p.yaml v1 | k1, k2 | "
        "`python bench/efficacy_bench.py --protocol p.yaml` | finished | gain +1.0 met \\| odd |",
    ]
    assert read_rows(ledger)[-2:] == [row, end]  # after the real ledger's rows
    assert earlier_looks(ledger, "p.yaml v1", "k1, k2", "r2") == [row]
    assert earlier_looks(ledger, "p.yaml v1", "k1, k2", "r1") == []
    assert earlier_looks(ledger, "p.yaml v1", "k1, k3", "r2") == []
    notes = _write(tmp_path / "notes.md", "# not a ledger\n")
    with pytest.raises(MiaError, match="not a ledger"):
        append_row(notes, row)
    assert notes.read_text() == "# not a ledger\n" and HEADER in before


def test_a_dev_protocol_never_opens_the_ledger(tmp_path: Path) -> None:
    from mia.apps.protocol import ProtocolOptions, open_ledger

    ledger = _write(tmp_path / "ledger.md", (ROOT / "docs" / "ledger.md").read_text())
    dev = load_protocol(_write(tmp_path / "d.yaml", TINY.format(seed=10000)))
    opts = ProtocolOptions(path=tmp_path / "d.yaml", out=tmp_path / "o", ledger=ledger)
    assert dev.kind == "dev"
    assert open_ledger(dev, opts, {"executor": "a", "planner": "b"}, "r") is None
    test = load_protocol(_write(tmp_path / "t.yaml", TINY.format(seed=20000)))
    opts = ProtocolOptions(path=tmp_path / "t.yaml", out=tmp_path / "o", ledger=ledger, root=ROOT)
    opened = open_ledger(test, opts, {"executor": "a", "planner": "b"}, "r")
    assert opened is not None and opened[1] == "-"
    assert (opened[0].protocol, opened[0].roles) == (f"{tmp_path / 't.yaml'} v1", "a, b")
    assert ledger.read_text() == (ROOT / "docs" / "ledger.md").read_text()  # opening writes nothing


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from role_fixtures import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.mark.slow
def test_a_test_protocol_runs_end_to_end_and_writes_the_ledger(
    tiny_model: Path, tmp_path: Path
) -> None:
    protocol = _write(tmp_path / "t.yaml", TINY.format(seed=20000))
    ledger = _write(tmp_path / "ledger.md", (ROOT / "docs" / "ledger.md").read_text())
    before = ledger.read_text()
    out = tmp_path / "out"
    args = ["--protocol", str(protocol), "--out", str(out), "--ledger", str(ledger), "--baselines",
            "--", "--model", str(tiny_model), "--no-progress"]  # fmt: skip
    r = _bench(*args, home=tmp_path / "home", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"protocol {protocol} v1 (test worlds 20000; run t-v1-")
    note = (
        "none reads and writes no memory, so its answers do not depend on the order: it runs "
        "once per world, on the file order, and stands for the shuffled order too"
    )
    assert f"  {note}" in lines and note in lines
    # Two new ledger rows under one run id: started, then finished with the targets' numbers.
    summary = json.loads((out / "protocol.json").read_text())
    assert ledger.read_text().startswith(before)
    started, finished = read_rows(ledger)[-2:]  # after the real ledger's rows
    command = f"`{' '.join(['python', 'bench/efficacy_bench.py', *args])}`"
    for row, event in ((started, "started"), (finished, "finished")):
        assert (row.run, row.protocol, row.roles, row.command, row.event) == (
            summary["run_id"], f"{protocol} v1", "model model, model model", command, event,
        )  # fmt: skip
        assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?|unknown", row.commit)
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row.date)
    assert started.result == "-" and finished.result == short_result(summary["targets"])
    assert finished.result.startswith("convention_gain ") and "; ttrl_learns " in finished.result
    # The streams: each order's questions in its order, every row's outcome per question.
    file_ = json.loads((out / "streams" / "world-20000-file.json").read_text())
    shuffled = json.loads((out / "streams" / "world-20000-shuffled.json").read_text())
    ids = ["w20000_test_00000", "w20000_test_00001", "w20000_test_00002", "w20000_test_00005"]
    assert [q["id"] for q in file_["questions"]] == ids
    assert [q["id"] for q in shuffled["questions"]] == [ids[i] for i in (0, 1, 3, 2)]
    assert [q["kind"] for q in file_["questions"]] == ["convention", "standard", "standard",
                                                       "convention"]  # fmt: skip
    rows = ["none", "mia", "feedback", "ttrl", "ttrl_lr0", "mem0"]
    for stream in (file_, shuffled):
        assert list(stream["rows"]) == rows
        for name in rows:
            assert sorted(stream["rows"][name]["outcomes"]) == sorted(ids), name
    assert shuffled["rows"]["none"]["reused_from"] == "file"
    assert shuffled["rows"]["none"]["outcomes"] == file_["rows"]["none"]["outcomes"]
    assert "reused_from" not in shuffled["rows"]["mia"]
    assert not (out / "world-20000" / "shuffled" / "none").exists()
    # Both TTRL passes ran on their own fresh memory; the lr=0 one took its GRPO steps' turns.
    for name in ("ttrl", "ttrl_lr0"):
        acc = out / "world-20000" / "file" / name / "ttrl" / "accuracy.jsonl"
        assert acc.is_file(), name
    # Tables per scope, the baselines' table, the targets, the plot.
    assert [t["scope"] for t in summary["tables"]] == ["all", "standard", "convention", "bridge"]
    assert [r["row"] for r in summary["tables"][0]["rows"]] == rows[:-1]
    assert summary["tables"][0]["questions"] == 8 and summary["kind"] == "test"
    assert [r["row"] for r in summary["baseline_tables"][0]["rows"]] == ["none", "mia", "mem0"]
    assert [t["name"] for t in summary["targets"]] == ["convention_gain", "no_kind_hurt",
                                                        "ttrl_learns"]  # fmt: skip
    assert (out / "protocol.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for t in summary["targets"]:
        assert f"  {t['line']}" in lines

    # The same roles again after the code changed (the look's commit is the repository's first
    # one): refused before anything runs; the ledger is unchanged.
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()[0][:7]  # fmt: skip
    ledger.write_text(ledger.read_text().replace(f"| {started.commit} |", f"| {first} |"))
    after = ledger.read_text()
    again = _bench(*[a if a != str(out) else str(tmp_path / "out2") for a in args],
                   home=tmp_path / "home")  # fmt: skip
    assert again.returncode == 2 and len(again.stderr.splitlines()) == 1
    assert (
        f"already holds a run of {protocol} v1 with these roles ({summary['run_id']}) and the "
        "code has changed since"
    ) in again.stderr
    assert (
        f"to reproduce {summary['run_id']}, run the same command in a clean checkout of {first}"
        in again.stderr
    )
    assert "--another-look" in again.stderr and ledger.read_text() == after


def test_a_look_on_unchanged_code_is_a_reproduction(tmp_path: Path) -> None:
    """A run of roles already looked at is a reproduction when that look's commit was clean and
    nothing outside docs/ changed since; otherwise another look, refused without the flag."""
    from mia.apps.protocol import ProtocolOptions, open_ledger
    from mia.eval.ledger import LedgerRow, append_row, unchanged_since
    from mia.eval.protocol import load_protocol

    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    ledger = _write(repo / "docs" / "ledger.md", (ROOT / "docs" / "ledger.md").read_text())
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")  # fmt: skip

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True,
                              check=True).stdout.strip()  # fmt: skip

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    head = git("rev-parse", "--short", "HEAD")
    protocol = load_protocol(ROOT / "configs" / "efficacy" / "protocol.yaml")
    opts = ProtocolOptions(path=ROOT / "configs" / "efficacy" / "protocol.yaml", out=tmp_path,
                           ledger=ledger, root=repo)  # fmt: skip
    roles = {"executor": "e1", "planner": "p1"}
    label = f"{ROOT / 'configs' / 'efficacy' / 'protocol.yaml'} v{protocol.version}"
    append_row(ledger, LedgerRow("r1", "2026-12-06 00:00:00", head, label, "e1, p1", "`c`",
                                 "started", "-"))  # fmt: skip
    assert unchanged_since(repo, head) and not unchanged_since(repo, head + "+dirty")
    opened = open_ledger(protocol, opts, roles, "r2")
    assert opened is not None and opened[1] == "reproduces r1"
    (repo / "docs" / "notes.md").write_text("docs may change\n")
    assert open_ledger(protocol, opts, roles, "r2")[1] == "reproduces r1"  # type: ignore[index]
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(MiaError, match="the code has changed since"):
        open_ledger(protocol, opts, roles, "r2")
    again = open_ledger(protocol, dataclasses.replace(opts, another_look=True), roles, "r2")
    assert again is not None and again[1] == "-"
    # Other roles are a first look.
    assert open_ledger(protocol, opts, {"executor": "e2", "planner": "p1"}, "r2")[1] == "-"  # type: ignore[index]
