"""Summary of an alternating A/B of seqpar generate (bench/omp_regions.sh --compare,
bench/team_help.sh): rows of "round form prefill_seconds decode_seconds_per_token", form 1 (on)
or 0 (off). Prints the medians and the ratio off / on (above 1: on is faster) as min / median /
max.

    python3 bench/ab_summary.py RUNS ON_NAME OFF_NAME
"""
import statistics
import sys


def main(path, on_name, off_name):
    rows = [line.split() for line in open(path) if line.strip()]
    print(f"\n| measure | {on_name} (median) | {off_name} (median) | "
          f"{off_name} / {on_name} min / median / max |")
    print("|---|---|---|---|")
    for col, name in ((2, "prefill s"), (3, "decode s / token")):
        on = {r[0]: float(r[col]) for r in rows if r[1] == "1"}
        off = {r[0]: float(r[col]) for r in rows if r[1] == "0"}
        ratios = sorted(off[k] / on[k] for k in on if k in off)
        print(f"| {name} | {statistics.median(on.values()):.4f} | "
              f"{statistics.median(off.values()):.4f} | {ratios[0]:.3f} / "
              f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")


if __name__ == "__main__":
    main(*sys.argv[1:4])
