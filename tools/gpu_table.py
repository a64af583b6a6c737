"""The GPU throughput table in docs/distributed.md, generated from the stored part-3 reports
(benchmarks/gpu/throughput/*.json, written by tools/gpu_check.sh): every measured row, each against the bare model
measured in the same command and mode. A test fails when the docs' block is stale.

    python tools/gpu_table.py            # rewrite the block in docs/distributed.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "benchmarks" / "gpu" / "throughput"
DOC = REPO / "docs" / "distributed.md"
BEGIN, END = "<!-- gpu-throughput: python tools/gpu_table.py -->", "<!-- /gpu-throughput -->"
MODES = {
    "synthetic": "in memory",
    "augment_only": "augmentation alone",
    "step_on_made_views": "step on views made once",
}
NOT_A_STEP = ("augment_only",)  # part of a step: no ratio to the bare step


def rows(report: dict, name: str) -> list[str]:
    out, link = [], f"{name}.md" if (REPORTS / f"{name}.md").exists() else f"{name}.json"
    for step in report["steps"].values():
        figures = step.get("figures") or {}
        for case in figures.get("results", []):
            modes = case.get("modes", {})
            bare = modes.get("reference", {}).get("views_per_s")
            compiled = case.get("compile_mode") or "default" if case.get("compile") else None
            how = "eager" if compiled is None else "compiled" if compiled == "default" else f"compiled, {compiled}"
            for mode, m in modes.items():
                views = m.get("views_per_s")
                if views is None or mode == "reference":
                    continue
                ratio = f"{views / bare:.0%}" if bare and mode not in NOT_A_STEP else "-"
                out.append(
                    f"| [{name}](../benchmarks/gpu/throughput/{link}) | {figures.get('device', '?')} "
                    f"| {case['model']} {case['image_size']} px, {case['batch']} | {how} | {MODES.get(mode, mode)} "
                    f"| {1000 * m['seconds_per_step']:.1f} | {views:,.0f} | {bare:,.0f} | {ratio} |"
                )
    return out


def table() -> list[str]:
    lines = [
        "| report | device | model, batch | compiled | trainer mode | ms/step | views/s | bare views/s | vs bare |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for path in sorted(REPORTS.glob("*.json")):
        lines += rows(json.loads(path.read_text()), path.stem)
    return lines


def block() -> str:
    return "\n".join([BEGIN, *table(), END])


def write(doc: Path = DOC) -> None:
    text = doc.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    doc.write_text(text[:start] + block() + text[stop:])


if __name__ == "__main__":
    write()
    print(f"gpu_table: {len(table()) - 2} rows into {DOC.relative_to(REPO)}", file=sys.stderr)
