"""The chaos run's quorum queue on a real node: its process and the WAL's killed, the whole
node killed, its WAL files and log segments cut and flipped; no confirmed message lost but
what the damage reached, and no delivery count going back."""

from warren.queues.engine.ra_log import LOG_DIRECTORY, QUORUM_DIRECTORY, WAL_DIRECTORY
from warren.supervisor.chaos.broker_run import QUORUM_QUEUE, TARGETS, run_chaos
from warren.supervisor.chaos.report import format_report
from warren.supervisor.chaos.workload import ledger_lines

QUORUM_FILES = (
    f"{QUORUM_DIRECTORY}/{WAL_DIRECTORY}/*.wal",
    f"queues/{QUORUM_QUEUE}/{LOG_DIRECTORY}/*.segment",
    f"queues/{QUORUM_QUEUE}/snapshot*",
)


def test_a_chaos_run_kills_tears_and_flips_a_quorum_queue_and_loses_no_confirmed_message(
    tmp_path,
):
    data_dir = tmp_path / "data"
    report = run_chaos(
        str(data_dir),
        duration_s=15,
        kinds=["kill", "node", "torn", "flip"],
        producers=len(TARGETS),  # the last publishes to the quorum queue
        consumers=2,
        sizes=(1024, 8192),
        seed=10,  # all four kinds fall in its first seconds
        patterns=(f"queue {QUORUM_QUEUE}", "wal"),
        files=QUORUM_FILES,
        every_s=(1.0, 2.0),
        report_dir=str(tmp_path / "report"),
        say=lambda line: None,
    )
    assert report["ok"], format_report(report)
    assert report["lost"] == 0 and report["wrong_bodies"] == 0
    assert report["counts_backwards"] == 0 and report["unflagged_duplicates"] == 0
    landed = [e for e in report["events"] if e["landed"]]
    assert {e["kind"] for e in landed} == {"kill", "node", "torn", "flip"}
    damaged = {e["target"].split("/")[0] for e in landed if e["kind"] in ("torn", "flip")}
    assert damaged <= {QUORUM_DIRECTORY, "queues"}
    # the quorum queue took part (how much depends on the machine's load)
    consumed = [
        line
        for path in (data_dir / "chaos-run").glob("consumer*.ledger")
        for line in ledger_lines(str(path))
        if line.startswith(QUORUM_QUEUE + " ")
    ]
    assert len(consumed) > 20
