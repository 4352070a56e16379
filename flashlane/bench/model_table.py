"""The table `flashlane bench model` prints before its JSON line: ours, the peer, ours over
the peer, and ours against the roofline, per measured figure."""

from __future__ import annotations

import sys


def table(result: dict) -> str:
    """ours, the peer, ours / the peer, and ours against the roofline, per measured figure."""
    peer = result.get("peer") or {}
    name = peer.get("name", "transformers")[:13]
    lines = [f"{'':24}{'ours':>12}{name:>14}{'ours/peer':>10}{'roofline':>10}"]
    for kind, key in (("decode", "tok_s"), ("prefill", "tok_s")):
        for n, r in result["ours"][kind].items():
            theirs = (peer.get(kind) or {}).get(n, {}).get(key)
            label = f"{kind} {n} {'streams' if kind == 'decode' else 'tokens'} tok/s"
            peer_s = f"{theirs:14.1f}" if theirs else f"{'-':>14}"
            if key not in r:  # a stream count ours could not run
                lines.append(f"{label:24}{'failed':>12}{peer_s}   {r.get('error', '')[:60]}")
                continue
            # an FP8 model's prefill against the e4m3 matrix rate where measured
            fp8 = r.get("of_fp8_matrix_rate")
            eff = r.get("of_roofline") or fp8 or r.get("of_matrix_rate")
            eff_s = f"{eff:10.0%}" if eff else f"{'-':>10}"
            ratio = f"{r[key] / theirs:10.2f}" if theirs else f"{'-':>10}"
            spread = (
                f"   median of {len(r['ttft_runs_s'])}, spread {r['spread']:.1%}"
                + (", of the e4m3 matrix rate" if fp8 else "")
                if ("spread" in r)
                else ""
            )
            lines.append(f"{label:24}{r[key]:12.1f}{peer_s}{ratio}{eff_s}{spread}")
    ours = result["ours"]
    for length, rows in (ours.get("decode_context") or {}).items():
        for n, r in rows.items():
            label = f"decode {n} at {length}"
            if "tok_s" not in r:
                lines.append(f"{label:24}{'failed':>12}{'-':>14}   {r.get('error', '')[:60]}")
                continue
            eff = f"{r['of_roofline']:10.0%}" if r.get("of_roofline") else f"{'-':>10}"
            lines.append(f"{label:24}{r['tok_s']:12.1f}{'-':>14}{'-':>10}{eff}")
    shared = (ours.get("decode_shared_rounds") or {}).get(1)
    if shared:
        lines.append(
            f"{'decode 1 stream, shared':24}{shared['tok_s']:12.1f}{'-':>14}{'-':>10}"
            f"{shared['of_roofline'] or 0:10.0%}   lone / shared "
            f"{ours['lone']['over_shared_rounds']:.2f}x"
        )
    for kind, r in (ours.get("decode_sampled") or {}).items():
        greedy = ours["decode_sampled"]["greedy"]["tok_s"]
        lines.append(
            f"{'decode 1 stream, ' + kind:24}{r['tok_s']:12.1f}{'-':>14}{'-':>10}"
            f"{r['of_roofline'] or 0:10.0%}   over greedy {r['tok_s'] / greedy:.2f}x"
        )
    if "launches_per_token" in ours:
        lines.append(
            f"launches per token, one stream: {ours['launches_per_token']:.1f}"
            f" (shared rounds {ours.get('launches_per_token_shared_rounds', 0):.1f})"
        )
    pc = ours.get("prompt_cache")
    if pc:
        lines.append(
            f"prompt cache, {pc['tokens']} tokens: TTFT cold {pc['cold']['ttft_s']:.3f} s, "
            f"resent {pc['resent']['ttft_s']:.3f} s ({pc['resent']['of_cold']:.1%}), "
            f"extended {pc['extended']['ttft_s']:.3f} s ({pc['extended']['of_cold']:.1%})"
        )
    lines += [f"FAILED: {why}" for why in failures(result)]
    return "\n".join(lines)


def failures(result: dict) -> list[str]:
    """Why the figures are not the product's: a capture that failed (the steps then ran
    eagerly: at 1a68afd every lone step did, 7% of the roofline on the H200)."""
    ours, why = result["ours"], []
    if ours.get("lone_failed"):
        why.append(
            f"the lone driver's captures failed, its steps ran eagerly: {ours['lone_failed']}"
        )
    if (ours.get("graphs") or {}).get("failed"):
        why.append(f"the round graphs' captures failed: {ours['graphs']['failed']}")
    return why


def failed_exit(result: dict) -> int:
    """Each of `failures` on stderr; the exit status: 1 if any."""
    broken = failures(result)
    for why in broken:
        print(f"flashlane bench model: {why}", file=sys.stderr)
    return 1 if broken else 0
