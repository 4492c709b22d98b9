"""``bench --report``: every published figure beside the emulated per-hit counts of the design it
measures, the cost model's held-out prediction of it, the published changes against the predicted
ones, this machine's native rows, the fitted per-event costs, and what the model cannot explain.

``build`` computes everything into plain data (the --json payload); ``render`` writes it as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emu.bench import published as pub
from emu.bench.costmodel import EVENT_HELP, EVENTS, CpuRows, fit_cpu, pooled_costs
from emu.bench.model import (
    NATIVE_CPU,
    ChangeCheck,
    Counts,
    HeldOut,
    Sources,
    check_change,
    cpu_fit,
    held_out,
    leave_one_out,
    predict,
    with_shares,
)
from emu.bench.native import NativeTime
from emu.bench.workloads import RSB_DEPTH, TRIG, Workload, _Tally
from emu.render import table

SHAPES = str(Path(TRIG).parent / "rsb_shapes")
SHORT = {"trap": "trap", "single_step": "step", "syscall": "sys", "sysret": "sysret", "iret": "iret", "hit": "hit",
         "uret_return": "uret", "insn": "insn", "rsb_miss": "rsb", "byte": "bytes", "mmap_lock": "lock"}


def _num(v: float) -> str:
    return f"{v:.2f}".rstrip("0").rstrip(".")


def verdict(c: ChangeCheck) -> str:
    off = abs(c.predicted - c.change.percent)
    if off > max(2 * c.sigma, 2.0):
        return "not explained"
    if c.sigma >= max(abs(c.predicted), abs(c.change.percent)):
        return "not determined (error bar wider than the change)"
    return "explained" if off <= max(c.sigma, 2.0) else "explained within 2 sigma"


def rsb_shapes() -> list[dict[str, Any]]:
    """Extra calls, rets and mispredicted returns per run of each rsb_shapes shape, against the plain one."""
    from emu.callret.rsb import RsbModel
    from emu.callret.tracker import CallRetTracker
    from emu.guestio import GuestIO
    from emu.machine import Machine, RunOptions

    def tally(shape: str) -> tuple[int, int, int]:
        m = Machine(SHAPES, [SHAPES, shape, "1"], {}, RunOptions(), GuestIO.captured())
        t = _Tally(m)
        rsb = RsbModel(CallRetTracker(m), RSB_DEPTH)
        m.run()
        return t.calls, t.rets, rsb.stats.mispredicted

    plain = tally("n")
    out = []
    for fig in pub.RSB_FIGURES:
        row: dict[str, Any] = {"label": fig.label, "mps_low": fig.mps_low, "mps_high": fig.mps_high, "shape": fig.shape,
                               "source": fig.source.value}
        if fig.shape is not None:
            calls, rets, miss = (x - y for x, y in zip(tally(fig.shape), plain, strict=True))
            row.update(calls=calls, rets=rets, rsb_mispredicts=miss)
        out.append(row)
    paired = next((r for r in out if r["shape"] == "c"), None)
    for r in out:
        if r["shape"] in ("a", "b") and paired is not None and r["rsb_mispredicts"] > paired["rsb_mispredicts"]:
            extra = _ns(r) - _ns(paired)
            r["ns_per_mispredict_vs_paired"] = extra / (r["rsb_mispredicts"] - paired["rsb_mispredicts"])
    return out


def _ns(rsb: dict[str, Any]) -> float:
    """Time per call of a published fexit figure (the middle of a published range)."""
    return 2e3 / float(rsb["mps_low"] + rsb["mps_high"])


def _held(h: HeldOut) -> dict[str, Any]:
    return {"measured_ns": h.measured_ns, "predicted_ns": h.predicted_ns, "sigma_ns": h.sigma_ns,
            "predicted_mps": 1e3 / h.predicted_ns, "error": h.error}


def _figures(src: Sources) -> list[dict[str, Any]]:
    out = []
    for c in src.cpus:
        if c.cpu == NATIVE_CPU:
            continue
        for row in c.rows:
            fig = src.figure_of.get((c.cpu, row.label))
            if fig is None:
                continue  # a share constraint
            h = held_out(src, c.cpu, with_shares(row.label), row.label)
            out.append({"cpu": c.cpu, "label": fig.label, "design": fig.design, "workload": fig.workload,
                        "published_mps": fig.mps, "published_err": fig.err, "source": fig.source.value,
                        "counts": dict(zip(EVENTS, row.counts, strict=True)), "held_out": _held(h)})
    return out


def _changes(src: Sources) -> list[dict[str, Any]]:
    out = []
    for change in pub.CHANGES:
        for with_share in (False, True):
            if with_share and not any(s.cpu == change.cpu and s.label == change.after for s in pub.SHARES):
                continue
            c = check_change(src, change, with_share)
            if c is not None:
                out.append({"cpu": change.cpu, "label": change.label, "published_pct": change.percent,
                            "predicted_pct": c.predicted, "sigma_pct": c.sigma, "with_share": with_share,
                            "verdict": verdict(c), "source": change.source.value})
    return out


def _shares(src: Sources) -> list[dict[str, Any]]:
    """The published time share against the model's, fitted without the share."""
    out = []
    for share in pub.SHARES:
        target = src.cpu(share.cpu)
        row = next((r for r in target.rows if r.label == share.label), None)
        if row is None:
            continue
        label = f"{share.label} {share.event} share"
        kept = CpuRows(target.cpu, tuple(r for r in target.rows if r.label != label))
        f = fit_cpu(kept, [*src.others(share.cpu), kept])
        k = EVENTS.index(share.event)
        ns, _ = f.predict(row.counts)
        out.append({"cpu": share.cpu, "label": share.label, "event": share.event, "published_pct": share.percent,
                    "model_pct": 100 * row.counts[k] * f.costs[k] / ns if ns else 0.0, "source": share.source.value})
    return out


def _costs(src: Sources) -> dict[str, Any]:
    out: dict[str, Any] = {"pooled_units_of_int3_nop": dict(zip(EVENTS, pooled_costs(src.cpus), strict=True))}
    for c in src.cpus:
        f = cpu_fit(src, c.cpu)
        out[c.cpu] = {"ns": dict(zip(EVENTS, f.costs, strict=True)),
                      "from_rows": dict(zip(EVENTS, f.identified, strict=True)), "rel_rms": f.rel_rms}
    return out


def _calibration(figures: Sequence[dict[str, Any]]) -> dict[str, float]:
    z = [abs(f["held_out"]["predicted_ns"] - f["held_out"]["measured_ns"]) / f["held_out"]["sigma_ns"] for f in figures]
    errs = sorted(abs(f["held_out"]["error"]) for f in figures)
    return {"rows": len(z), "within_1_sigma": sum(v <= 1 for v in z) / len(z), "within_2_sigma": sum(v <= 2 for v in z) / len(z),
            "median_abs_error": errs[len(errs) // 2], "max_abs_error": errs[-1]}


def build(counts: Counts, src: Sources, native: Sequence[NativeTime] | None, native_reason: str | None,
          designs: Sequence[str] = (), workloads: Sequence[Workload] = ()) -> dict[str, Any]:
    """The report's data; ``designs`` x ``workloads`` get predicted rates on every CPU."""
    figures = _figures(src)
    payload: dict[str, Any] = {
        "events": {e: EVENT_HELP[e] for e in EVENTS},
        "figures": figures, "calibration": _calibration(figures), "changes": _changes(src), "shares": _shares(src),
        "costs": _costs(src), "rsb": rsb_shapes(),
        "this_project": [{"label": f.label, "workload": f.workload, "published_mps": f.mps, "source": f.source.value}
                         for f in pub.THIS_PROJECT],
    }
    if native:
        loo = leave_one_out(src, NATIVE_CPU)
        payload["native"] = {
            "rows": [{"workload": h.label, **_held(h), "counts": dict(zip(EVENTS, r.counts, strict=True))}
                     for h, r in zip(loo, (r for r in src.cpu(NATIVE_CPU).rows if r.ns > 0), strict=True)],
            "rms_error": (sum(h.error ** 2 for h in loo) / len(loo)) ** 0.5,
            "median_abs_error": sorted(abs(h.error) for h in loo)[len(loo) // 2],
        }
    else:
        payload["native"] = {"unavailable": native_reason}
    payload["fix_minus_base"] = {cpu: _fix_minus_base(src, cpu) for cpu in pub.REDZONE_CPUS}
    payload["unexplained"] = unexplained(payload)
    payload["predictions"] = {c.cpu: [{"design": p.design, "workload": p.workload, "mps": p.mps, "err_mps": p.err_mps}
                                      for p in predict(src, c.cpu, designs, workloads, counts)] for c in src.cpus}
    return payload


def _fix_minus_base(src: Sources, cpu: str) -> dict[str, float]:
    """The in-sample fit's account of the fix's time against the base's, event by event (ns)."""
    rows = {r.label: r for r in src.cpu(cpu).rows}
    costs = cpu_fit(src, cpu).costs
    fix, base = rows["usdt-nop5-fix"].counts, rows["usdt-nop5-base"].counts
    return {e: (f - b) * c for e, f, b, c in zip(EVENTS, fix, base, costs, strict=True)}


def unexplained(payload: dict[str, Any]) -> list[str]:
    """What the counts and the model do not account for, in words."""
    out = []
    costs = payload["costs"]
    for ch in payload["changes"]:
        if ch["verdict"].startswith("explained") or ch["with_share"]:
            continue
        line = (f"{ch['cpu']} {ch['label']}: published {ch['published_pct']:+.1f}%, predicted "
                f"{ch['predicted_pct']:+.1f} ± {ch['sigma_pct']:.1f}% with the changed figure held out: {ch['verdict']}.")
        if ch["label"] == "nop5-change":
            pooled = costs["pooled_units_of_int3_nop"]["mmap_lock"]
            split = ", ".join(f"{SHORT[e]} {v:+.0f} ns" for e, v in payload["fix_minus_base"][ch["cpu"]].items() if abs(v) >= 0.5)
            line += (f" The counts see one mmap_lock acquisition fewer per hit in the fix (the slot is found under "
                     f"RCU), but the pooled lock cost is {pooled:.3f} INT3-nop hits: no other CPU's rows price the lock. "
                     f"Fitted with its own fix row, this CPU's fix-minus-base time splits as {split}: the lock and the "
                     "bytes copied both drop in the fix, so three rows cannot tell which one pays for the gain.")
        out.append(line)
    worst = [f for f in payload["figures"] if abs(f["held_out"]["error"]) > 0.25]
    for f in worst:
        out.append(f"{f['cpu']} {f['label']}: held out, predicted {f['held_out']['predicted_mps']:.3f} M/s against "
                   f"{f['published_mps']} ({f['held_out']['error']:+.0%} in time per hit).")
    for rsb in payload["rsb"]:
        if rsb["shape"] == "b":
            a = next(r for r in payload["rsb"] if r["shape"] == "a")
            out.append(f"fexit shapes: priced against the paired shape, an extra mispredict costs "
                       f"{a['ns_per_mispredict_vs_paired']:.2f} ns by the original shape (5 of them) but "
                       f"{rsb['ns_per_mispredict_vs_paired']:.2f} ns by the intermediate fix (1): a per-mispredict cost "
                       "cannot fit all three; the intermediate fix's extra ret and stub, or a chain deeper than "
                       "rsb_shapes' four levels, are not in the counts.")
    return out


# ------------------------------------------------------------------ text
def render(payload: dict[str, Any]) -> str:
    lines = ["# Published figures beside the emulated counts and the cost model", "",
             "Counts are per hit, exact, from the emulator; time per hit = sum of count x per-event cost, costs fitted",
             "per CPU (weighted non-negative least squares, regularised towards costs pooled over all CPUs in units",
             "of each CPU's INT3-nop hit). 'held out' predicts a figure from a fit without it.", "",
             "Events: " + "; ".join(f"{SHORT[e]} = {h}" for e, h in payload["events"].items()), ""]
    lines += _render_figures(payload)
    lines += _render_changes(payload)
    lines += _render_rsb(payload)
    lines += _render_native(payload)
    lines += _render_costs(payload)
    lines += _render_predictions(payload)
    lines += ["## What the model cannot explain", ""]
    lines += [f"- {u}" for u in payload["unexplained"]] or ["- nothing beyond the error bars"]
    return "\n".join(lines) + "\n"


def _render_figures(payload: dict[str, Any]) -> list[str]:
    out = []
    by_source: dict[str, list[dict[str, Any]]] = {}
    for f in payload["figures"]:
        by_source.setdefault(f["source"], []).append(f)
    for source, figs in by_source.items():
        rows: list[tuple[str, ...]] = [("cpu", "figure", "design", "workload", "published M/s", "held out M/s", "time error",
                                        *(SHORT[e] for e in EVENTS))]
        for f in figs:
            h = f["held_out"]
            err = f" ± {f['published_err']}" if f["published_err"] is not None else ""
            sd = h["predicted_mps"] * h["sigma_ns"] / h["predicted_ns"]
            rows.append((f["cpu"], f["label"], f["design"], f["workload"], f"{f['published_mps']}{err}",
                         f"{h['predicted_mps']:.3f} ± {sd:.3f}", f"{h['error']:+.1%}", *(_num(f["counts"][e]) for e in EVENTS)))
        out += [f"## {source}", "", table(rows), ""]
    cal = payload["calibration"]
    out += [f"Held-out predictions of the {cal['rows']} published rows: median |error| {cal['median_abs_error']:.1%}, "
            f"max {cal['max_abs_error']:.1%}; {cal['within_1_sigma']:.0%} within 1 sigma, {cal['within_2_sigma']:.0%} "
            "within 2 sigma (the error bars' calibration).", ""]
    return out


def _render_changes(payload: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [("cpu", "change", "published", "predicted (figure held out)", "fit keeps", "verdict")]
    for c in payload["changes"]:
        rows.append((c["cpu"], c["label"], f"{c['published_pct']:+.1f}%", f"{c['predicted_pct']:+.1f} ± {c['sigma_pct']:.1f}%",
                     "its iret% share" if c["with_share"] else "-", c["verdict"]))
    shares: list[tuple[str, ...]] = [("cpu", "figure", "event", "published share", "model share (share held out)")]
    for s in payload["shares"]:
        shares.append((s["cpu"], s["label"], s["event"], f"{s['published_pct']:.1f}%", f"{s['model_pct']:.1f}%"))
    return ["## Published changes against the predicted ones", "", table(rows), "", table(shares), ""]


def _render_rsb(payload: dict[str, Any]) -> list[str]:
    rows: list[tuple[str, ...]] = [("published", "M/s", "rsb_shapes shape", "extra calls", "extra rets", "extra mispredicts",
                                    "ns per extra mispredict (vs paired)")]
    for r in payload["rsb"]:
        rate = f"{r['mps_low']:g}" if r["mps_low"] == r["mps_high"] else f"{r['mps_low']:g}-{r['mps_high']:g}"
        per = r.get("ns_per_mispredict_vs_paired")
        rows.append((r["label"], rate, r["shape"] or "-", *(str(r.get(k, "-")) for k in ("calls", "rets", "rsb_mispredicts")),
                     f"{per:.2f}" if per is not None else "-"))
    return [f"## {pub.Source.RSB.value} (--rsb {RSB_DEPTH}, elf_samples/rsb_shapes)", "", table(rows), "",
            "Shapes are per run of a 4-level call chain; the kernel's chain above the traced function differs, so the",
            "mispredict counts are per shape, not per published call.", ""]


def _render_native(payload: dict[str, Any]) -> list[str]:
    out = ["## This machine, natively (the real kernel, a counting perf uprobe)", ""]
    native = payload["native"]
    rows_now = native.get("rows", [])
    if "unavailable" in native:
        out += [f"Not measured: {native['unavailable']}.", ""]
    else:
        rows: list[tuple[str, ...]] = [("workload", "measured ns/hit", "M/s", "held out ns/hit", "time error")]
        for r in rows_now:
            rows.append((r["workload"], f"{r['measured_ns']:.0f}", f"{1e3 / r['measured_ns']:.3f}",
                         f"{r['predicted_ns']:.0f} ± {r['sigma_ns']:.0f}", f"{r['error']:+.1%}"))
        out += [table(rows), "", f"Leave-one-out error: rms {native['rms_error']:.1%}, median |error| "
                f"{native['median_abs_error']:.1%} (each row predicted from a fit without it; the syscall baseline is "
                "the only row pricing a syscall apart from a hit).", ""]
    for f in payload["this_project"]:
        got = next((r for r in rows_now if r["workload"] == f["workload"]), None)
        now = f"; measured now {1e3 / got['measured_ns']:.3f} M/s" if got else ""
        out.append(f"- {f['source']}: {f['label']} ({f['workload']}) {f['published_mps']} M/s{now}.")
    return out + [""]


def _render_predictions(payload: dict[str, Any]) -> list[str]:
    cpus = list(payload["predictions"])
    if not cpus or not payload["predictions"][cpus[0]]:
        return []
    rows: list[tuple[str, ...]] = [("design", "workload", *cpus)]
    for i, p in enumerate(payload["predictions"][cpus[0]]):
        cells = (payload["predictions"][c][i] for c in cpus)
        rows.append((p["design"], p["workload"], *(f"{q['mps']:.3f}±{q['err_mps']:.3f}" for q in cells)))
    return ["## Predicted native rates of the selected designs (M/s, 1 sigma)", "", table(rows), ""]


def _render_costs(payload: dict[str, Any]) -> list[str]:
    costs = payload["costs"]
    rows: list[tuple[str, ...]] = [("cpu", *(SHORT[e] for e in EVENTS), "rms")]
    rows.append(("pooled (INT3-nop units)", *(f"{v:.3f}" for v in costs["pooled_units_of_int3_nop"].values()), "-"))
    for cpu, c in costs.items():
        if cpu == "pooled_units_of_int3_nop":
            continue
        rows.append((cpu, *(f"{v:.1f}" + ("" if c["from_rows"][e] else "~") for e, v in c["ns"].items()),
                     f"{c['rel_rms']:.1%}"))
    return ["## Fitted per-event costs (ns; ~ = the CPU's rows do not determine it: the pooled prior's value)", "",
            table(rows), ""]


def missing_figures(text: str) -> list[str]:
    """Published figures the report text does not show: each needs one line naming it with its number."""
    lines = text.splitlines()

    def shown(*parts: str) -> bool:
        return any(all(p in line for p in parts) for line in lines)

    out = [f"{f.cpu} {f.label} {f.mps}" for f in pub.FIGURES if not shown(f.cpu, f"{f.label} ", str(f.mps))]
    out += [f"{c.cpu} {c.label} {c.percent:+.1f}%" for c in pub.CHANGES if not shown(c.cpu, c.label, f"{c.percent:+.1f}%")]
    out += [f"{s.cpu} {s.label} {s.percent:.1f}%" for s in pub.SHARES if not shown(s.cpu, s.label, f"{s.percent:.1f}%")]
    out += [r.label for r in pub.RSB_FIGURES if not shown(r.label, f"{r.mps_low:g}")]
    out += [f"{f.label} {f.mps}" for f in pub.THIS_PROJECT if not shown(f.source.value, f.label, str(f.mps))]
    return out
