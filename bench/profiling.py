"""py-spy profiles of a gateway worker under load, for ``--profile DIR`` (bench/run.py runs them
for the gateway's own scenarios, bench/ledger.py for its credit gateways)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.common import Bench, Server
from bench.flame import render


def profile_jobs(
    bench: Bench, gw: Server, jobs: dict[str, dict[str, Any]], outdir: Path, seconds: float
) -> list[str]:
    """py-spy ``gw``'s worker for ``seconds`` under each job (named by its file); the summaries."""
    spy = shutil.which("py-spy")
    if spy is None:
        return ["py-spy not found (pip install py-spy): no profiles taken"]
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, job in jobs.items():
        job["cap_s"] = seconds + 5
        load = bench.run_load(job, gw)
        assert load.stderr is not None
        for line in load.stderr:  # payments and sign-ins are prepared first, then warm-up
            if line.strip() == "measuring":
                break
        raw = outdir / f"{name}.txt"
        record = ["record", "--pid", str(gw.worker_pid()), "--rate", "250", "--nonblocking"]
        subprocess.run(
            [spy, *record, "--format", "raw", "--duration", str(int(seconds)), "--output", str(raw)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        load.communicate(timeout=3 * seconds + 120)
        if raw.exists():
            summary = outdir / f"{name}.summary.txt"
            summary.write_text(render(raw, top=40) + "\n", encoding="utf-8")
            written.append(str(summary))
            print(f"  profile written: {summary}", flush=True)
    return written
