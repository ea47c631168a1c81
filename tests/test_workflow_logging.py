"""workflow.logged: a failing job's traceback is in its log file, and shown once on stderr."""

import subprocess
import sys
import textwrap

from conftest import REPO


def test_a_failing_job_shows_its_error_once(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO / "src")!r})
        from dpr_pipeline.errors import DataError
        from dpr_pipeline.workflow import logged

        with logged({str(tmp_path / "job.log")!r}) as log:
            log.info("started")
            raise DataError("data/x/corpus.jsonl", "duplicate document id 'd2'", "give every document a unique id",
                            line=5)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert done.returncode == 1
    message = "data/x/corpus.jsonl, line 5: duplicate document id 'd2'. Fix: give every document a unique id"
    assert done.stderr.count("Traceback (most recent call last)") == 1, done.stderr
    assert done.stderr.count(message) == 1, done.stderr
    assert "started" in done.stderr
    log = (tmp_path / "job.log").read_text()
    assert "started" in log and log.count("Traceback (most recent call last)") == 1 and log.count(message) == 1
