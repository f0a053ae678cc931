"""The step-path benchmarks run end to end and write comparable records (tiny sizes here:
the figures themselves are measured with `mistk-rl bench`, never asserted)."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_bench_transport_and_envs_write_records(tmp_path):
    for what in ("transport", "envs"):
        out = tmp_path / f"{what}.json"
        proc = subprocess.run([sys.executable, "-m", "mistk_rl", "bench", what, "--envs", "2",
                               "--steps", "60", "--json", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr
        records = json.loads(out.read_text())["records"]
        modes = {r["mode"] for r in records}
        expected = ({"inprocess", "http", "http-binary"} if what == "transport" else
                    {"base", "subprocess", "async", "gym_sync", "gym_async"})
        assert modes == expected
        for record in records:
            assert record["bench"] == what and record["envs"] == 2
            assert record["steps_per_s"] > 0
