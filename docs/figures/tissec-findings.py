#!/usr/bin/env python3
"""The statements of TISSEC §6, each checked against `conclave bench events` data.

Every criterion below was written down before the runs it judges (see the
git history: this file is committed before docs/figures/tissec-*/ were
regenerated). Run from the repository root after regenerating the figures:

    python3 docs/figures/tissec-findings.py [DIR]

It prints one Markdown row per statement: where in §6, what the paper says,
the criterion, the numbers it used, and whether the data agree.
"""
import csv
import statistics
import sys
from pathlib import Path

# The directory holding tissec-lan-512/ etc. (default: this one).
ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
PROTOS = ["gdh", "ckd", "tgdh", "str", "bd"]


def load(name):
    d, sides = {}, {}
    for r in csv.DictReader(open(ROOT / name / "events.csv")):
        d[(r["protocol"], r["event"], int(r["n"]))] = float(r["mean_ms"])
    p = ROOT / name / "sides.csv"
    if p.exists():
        for r in csv.DictReader(open(p)):
            sides[(r["protocol"], r["event"], int(r["n"]))] = (float(r["first_side_ms"]), float(r["second_side_ms"]))
    return d, sides


LAN512, SIDES512 = load("tissec-lan-512")
LAN1024, SIDES1024 = load("tissec-lan-1024")
WAN, _ = load("tissec-wan-512")


def sizes(d, event, lo=0, hi=10**9):
    return sorted({n for (p, e, n) in d if e == event and lo <= n <= hi})


def t(d, p, e, n):
    return d[(p, e, n)]


def lowest(d, e, n, among=PROTOS):
    return min(among, key=lambda p: t(d, p, e, n))


def highest(d, e, n, among=PROTOS):
    return max(among, key=lambda p: t(d, p, e, n))


def share(ns, pred):
    hits = [n for n in ns if pred(n)]
    return len(hits), len(ns)


def majority(ns, pred):
    k, m = share(ns, pred)
    return k * 2 > m, f"{k}/{m} sizes"


def every(ns, pred):
    k, m = share(ns, pred)
    return k == m, f"{k}/{m} sizes"


def at(d, e, n, ps=PROTOS):
    return ", ".join(f"{p.upper()} {t(d, p, e, n):.0f}" for p in ps)


rows = []


def row(where, paper, criterion, result, numbers):
    ok, detail = result
    rows.append((where, paper, criterion, f"{detail}; {numbers}", "yes" if ok else "**no**"))


# --- §6.1.3 join, LAN ---
D, e = LAN512, "join"
row("§6.1.3 join 512", "STR outperforms the others overall", "STR lowest at most sizes n ≥ 10",
    majority(sizes(D, e, 10), lambda n: lowest(D, e, n) == "str"), "n=50: " + at(D, e, 50))
row("§6.1.3 join 512", "BD most efficient below about 7 members", "BD lowest at every n < 7",
    every(sizes(D, e, 0, 6), lambda n: lowest(D, e, n) == "bd"), "n=6: " + at(D, e, 6))
row("§6.1.3 join 512", "past 30 members BD is the worst", "BD highest at every n > 30",
    every(sizes(D, e, 31), lambda n: highest(D, e, n) == "bd"), "n=34: " + at(D, e, 34))


def bd_steps(D, e):
    ns = sizes(D, e)
    incs = [(a, b, t(D, "bd", e, b) - t(D, "bd", e, a)) for a, b in zip(ns, ns[1:])]
    straddle = [x for x in incs if any(a < k <= b for k in (14, 27, 40) for a, b in [(x[0], x[1])])]
    other = [x[2] for x in incs if x not in straddle]
    med = statistics.median(other) if other else 0.0
    ok = all(x[2] > 2 * med for x in straddle)
    nums = "steps over 13/26/39: " + ", ".join(f"{a}→{b} +{d:.0f}" for a, b, d in straddle) + f"; median other step +{med:.0f} ms"
    return (ok, "each > 2× median" if ok else "not each > 2× median"), nums


res, nums = bd_steps(D, e)
row("§6.1.3 join 512, §6.4", "BD's cost steps up every 13 members (one more member per machine)",
    "each 4-member increase of BD across 13, 26, 39 > 2× the median other increase", res, nums)
D = LAN1024
row("§6.1.3 join 1024", "GDH the worst", "GDH highest at most sizes",
    majority(sizes(D, e), lambda n: highest(D, e, n) == "gdh"), "n=50: " + at(D, e, 50))
row("§6.1.3 join 1024", "BD best up to 14 members", "BD lowest at every n ≤ 14",
    every(sizes(D, e, 0, 14), lambda n: lowest(D, e, n) == "bd"), "n=14: " + at(D, e, 14))
for D, bits in ((LAN512, 512), (LAN1024, 1024)):
    row(f"§6.1.3 join {bits}", "TGDH and STR fairly close, STR slightly better",
        "TGDH/STR within 1/1.3–1.3 at every size, STR ≤ TGDH at most",
        (every(sizes(D, e), lambda n: 1 / 1.3 <= t(D, "tgdh", e, n) / t(D, "str", e, n) <= 1.3)[0]
         and majority(sizes(D, e), lambda n: t(D, "str", e, n) <= t(D, "tgdh", e, n))[0],
         "TGDH/STR " + ", ".join(f"{t(D, 'tgdh', e, n) / t(D, 'str', e, n):.2f}" for n in sizes(D, e))),
        "")

# --- §6.1.4 leave, LAN ---
e = "leave"
D = LAN512
row("§6.1.4 leave 512", "TGDH best", "TGDH lowest at most sizes n ≥ 10",
    majority(sizes(D, e, 10), lambda n: lowest(D, e, n) == "tgdh"), "n=50: " + at(D, e, 50))
row("§6.1.4 leave 512", "GDH second best, close to CKD",
    "GDH second lowest (or tied with CKD within 10%) at most sizes n ≥ 10",
    majority(sizes(D, e, 10), lambda n: sorted(PROTOS, key=lambda p: t(D, p, e, n))[1] == "gdh"
             or abs(t(D, "gdh", e, n) / t(D, "ckd", e, n) - 1) <= 0.1 and
             sorted(PROTOS, key=lambda p: t(D, p, e, n))[1] in ("gdh", "ckd")), "")
row("§6.1.4 leave 512", "BD the worst", "BD highest at n = 50 and at most sizes",
    (highest(D, e, 50) == "bd" and majority(sizes(D, e), lambda n: highest(D, e, n) == "bd")[0],
     majority(sizes(D, e), lambda n: highest(D, e, n) == "bd")[1]), "n=50: " + at(D, e, 50))
slope = lambda D, p: (t(D, p, e, 50) - t(D, p, e, 10)) / 40
row("§6.1.4 leave 512", "STR's slope steeper than CKD's and GDH's", "STR's ms per member (10→50) above both",
    (slope(D, "str") > max(slope(D, "gdh"), slope(D, "ckd")), ""),
    f"STR {slope(D, 'str'):.2f}, GDH {slope(D, 'gdh'):.2f}, CKD {slope(D, 'ckd'):.2f} ms/member")
D = LAN1024
row("§6.1.4 leave 1024", "STR the most expensive", "STR highest at most sizes",
    majority(sizes(D, e), lambda n: highest(D, e, n) == "str"), "n=50: " + at(D, e, 50))
r = t(LAN1024, "tgdh", e, 50) / t(LAN512, "tgdh", e, 50)
row("§6.1.4 leave 1024", "TGDH still best, about twice its 512-bit time",
    "TGDH lowest at most sizes n ≥ 10 and 1.5–2.5× its 512-bit time at 50",
    (majority(sizes(D, e, 10), lambda n: lowest(D, e, n) == "tgdh")[0] and 1.5 <= r <= 2.5,
     majority(sizes(D, e, 10), lambda n: lowest(D, e, n) == "tgdh")[1]), f"1024/512 at 50: {r:.2f}")
row("§6.1.4 leave 1024", "BD close to or better than GDH below about 37", "BD ≤ 1.1 × GDH at every n < 37",
    every(sizes(D, e, 0, 36), lambda n: t(D, "bd", e, n) <= 1.1 * t(D, "gdh", e, n)), "n=34: " + at(D, e, 34, ["bd", "gdh"]))

# --- §6.1.5 partition, LAN (partition between servers) ---
e = "partition"
for D, bits in ((LAN512, 512), (LAN1024, 1024)):
    row(f"§6.1.5 partition {bits}", "GDH clearly best", "GDH lowest at most sizes",
        majority(sizes(D, e), lambda n: lowest(D, e, n) == "gdh"), "n=50: " + at(D, e, 50))
    row(f"§6.1.5 partition {bits}", "STR the most expensive", "STR highest at most sizes",
        majority(sizes(D, e), lambda n: highest(D, e, n) == "str"), "")
    row(f"§6.1.5 partition {bits}", "CKD above Table II's estimate (≈ GDH): the side without the controller sets up channels",
        "CKD > 1.2 × GDH at most sizes", majority(sizes(D, e), lambda n: t(D, "ckd", e, n) > 1.2 * t(D, "gdh", e, n)), "")
# Fig. 13
for D, S, bits in ((LAN512, SIDES512, 512), (LAN1024, SIDES1024, 1024)):
    ns = sizes(D, "partition-p1", 10)
    row(f"§6.1.5 Fig. 13 {bits}", "TGDH: the same partition again (P2) is much cheaper", "TGDH P2 ≤ 0.7 × P1 at most n ≥ 10",
        majority(ns, lambda n: t(D, "tgdh", "partition-p2", n) <= 0.7 * t(D, "tgdh", "partition-p1", n)),
        "P2/P1 " + ", ".join(f"{t(D, 'tgdh', 'partition-p2', n) / t(D, 'tgdh', 'partition-p1', n):.2f}" for n in ns))
    row(f"§6.1.5 Fig. 13 {bits}", "GDH and BD: P2 costs what P1 does", "P2 within 10% of P1 for GDH and BD at every n ≥ 10",
        every(ns, lambda n: all(abs(t(D, p, "partition-p2", n) / t(D, p, "partition-p1", n) - 1) <= 0.1 for p in ("gdh", "bd"))), "")
    row(f"§6.1.5 Fig. 13 {bits}", "STR gains at P2 for G2 (even members), not for G1 (odd)",
        "STR even side P2 ≤ 0.7 × P1 and odd side P2 > 0.9 × P1, at most n ≥ 10",
        majority(ns, lambda n: S[("str", "partition-p2", n)][1] <= 0.7 * S[("str", "partition-p1", n)][1]
                 and S[("str", "partition-p2", n)][0] > 0.9 * S[("str", "partition-p1", n)][0]),
        "odd P2/P1 " + ", ".join(f"{S[('str', 'partition-p2', n)][0] / S[('str', 'partition-p1', n)][0]:.2f}" for n in ns)
        + "; even " + ", ".join(f"{S[('str', 'partition-p2', n)][1] / S[('str', 'partition-p1', n)][1]:.2f}" for n in ns))
    row(f"§6.1.5 Fig. 13 {bits}", "CKD: G2 (new controller) costs more than G1", "CKD P1 even side > odd side at most n ≥ 10",
        majority(ns, lambda n: S[("ckd", "partition-p1", n)][1] > S[("ckd", "partition-p1", n)][0]), "")

# --- §6.1.6 merge, LAN ---
e = "merge"
for D, bits in ((LAN512, 512), (LAN1024, 1024)):
    row(f"§6.1.6 merge {bits}", "GDH by far the most expensive", "GDH highest at most sizes",
        majority(sizes(D, e), lambda n: highest(D, e, n) == "gdh"), "n=50: " + at(D, e, 50))
    row(f"§6.1.6 merge {bits}", "TGDH the best", "TGDH lowest at most sizes",
        majority(sizes(D, e), lambda n: lowest(D, e, n) == "tgdh"), "")
    row(f"§6.1.6 merge {bits}", "STR comparable to CKD", "STR/CKD within 1/1.3–1.3 at most sizes",
        majority(sizes(D, e), lambda n: 1 / 1.3 <= t(D, "str", e, n) / t(D, "ckd", e, n) <= 1.3), "")
    row(f"§6.1.6 merge {bits}", "BD looks good beside GDH, STR and CKD", "BD below GDH, STR and CKD at most sizes",
        majority(sizes(D, e), lambda n: all(t(D, "bd", e, n) < t(D, p, e, n) for p in ("gdh", "str", "ckd"))), "")

# --- §6.2 WAN ---
D = WAN
e = "join"
row("§6.2.1–2 join WAN", "WAN membership 400–670 ms: even 2 members pay it", "every protocol's 2-member join > 400 ms",
    (all(t(D, p, e, 2) > 400 for p in PROTOS), ""), "n=2: " + at(D, e, 2))
row("§6.2.2 join WAN", "GDH significantly worse than the others (4 rounds)", "GDH highest at every size",
    every(sizes(D, e), lambda n: highest(D, e, n) == "gdh"), "n=50: " + at(D, e, 50))
row("§6.2.2 join WAN", "BD more expensive past 30", "BD above STR and TGDH at every n > 30",
    every(sizes(D, e, 31), lambda n: t(D, "bd", e, n) > max(t(D, "str", e, n), t(D, "tgdh", e, n))), "")
row("§6.2.2 join WAN", "STR and TGDH very similar", "STR/TGDH within 1/1.15–1.15 at most sizes",
    majority(sizes(D, e), lambda n: 1 / 1.15 <= t(D, "str", e, n) / t(D, "tgdh", e, n) <= 1.15), "")
row("§6.2.2 join WAN", "STR and TGDH come close to BD (the token serializes their two broadcasts)",
    "STR and TGDH within 1.25× of BD at every n ≤ 30",
    every(sizes(D, e, 0, 30), lambda n: max(t(D, "str", e, n), t(D, "tgdh", e, n)) <= 1.25 * t(D, "bd", e, n)), "n=18: " + at(D, e, 18))
row("§6.2.2 join WAN", "CKD competitive (its extra round is unicasts)", "CKD within 1.25× of the best of STR, TGDH, BD at most sizes",
    majority(sizes(D, e), lambda n: t(D, "ckd", e, n) <= 1.25 * min(t(D, p, e, n) for p in ("str", "tgdh", "bd"))), "")
e = "leave"
row("§6.2.3 leave WAN", "BD clearly the most expensive", "BD highest at most sizes",
    majority(sizes(D, e), lambda n: highest(D, e, n) == "bd"), "n=50: " + at(D, e, 50))
row("§6.2.3 leave WAN", "GDH, CKD and TGDH similar", "max/min of the three ≤ 1.2 at most sizes",
    majority(sizes(D, e), lambda n: max(t(D, p, e, n) for p in ("gdh", "ckd", "tgdh")) <= 1.2 * min(t(D, p, e, n) for p in ("gdh", "ckd", "tgdh"))), "")
row("§6.2.3 leave WAN", "STR above those three (computation)", "STR above GDH, CKD and TGDH at most sizes",
    majority(sizes(D, e), lambda n: t(D, "str", e, n) > max(t(D, p, e, n) for p in ("gdh", "ckd", "tgdh"))), "")
# --- §6.3 predictions ---
e = "partition"
row("§6.3 partition WAN (predicted)", "few-round protocols (STR, GDH) outperform the others", "STR and GDH both below TGDH, CKD and BD at most sizes",
    majority(sizes(D, e), lambda n: max(t(D, "str", e, n), t(D, "gdh", e, n)) < min(t(D, p, e, n) for p in ("tgdh", "ckd", "bd"))), "n=50: " + at(D, e, 50))
row("§6.3 partition WAN (predicted)", "TGDH poor (several rounds)", "TGDH above GDH and STR at most sizes",
    majority(sizes(D, e), lambda n: t(D, "tgdh", e, n) > max(t(D, "gdh", e, n), t(D, "str", e, n))), "")
row("§6.3 partition WAN (predicted)", "CKD needs several rounds (new controller's channels)", "CKD above GDH at most sizes",
    majority(sizes(D, e), lambda n: t(D, "ckd", e, n) > t(D, "gdh", e, n)), "")
row("§6.3 WAN (predicted)", "BD's partition / merge cost its leave / join cost", "within 20% at most sizes (both pairs)",
    majority(sizes(D, "partition"), lambda n: abs(t(D, "bd", "partition", n) / t(D, "bd", "leave", n) - 1) <= 0.2
             and abs(t(D, "bd", "merge", n) / t(D, "bd", "join", n) - 1) <= 0.2), "")
e = "merge"
row("§6.3 merge WAN (predicted)", "STR, TGDH and BD (two rounds) the most efficient", "GDH and CKD above all three at most sizes",
    majority(sizes(D, e), lambda n: min(t(D, "gdh", e, n), t(D, "ckd", e, n)) > max(t(D, p, e, n) for p in ("str", "tgdh", "bd"))), "n=50: " + at(D, e, 50))
# --- §6.4 summary ---
ratios = [t(WAN, p, e2, n) / t(LAN512, p, e2, n) for p in PROTOS for e2 in ("join", "leave") for n in sizes(WAN, e2)]
row("§6.4", "on a long-delay network communication dominates", "WAN ≥ 3 × LAN (512) at every join and leave point",
    (min(ratios) >= 3, f"min WAN/LAN {min(ratios):.1f}"), "")
worst = [(name, e2) for name, D2 in (("LAN 512", LAN512), ("WAN", WAN)) for e2 in ("join", "leave") if highest(D2, e2, 50) == "bd"]
row("§6.4", "n simultaneous broadcasts are expensive (BD)", "BD highest at n = 50 in LAN-512 and WAN join and leave (4 cases)",
    (len(worst) == 4, f"{len(worst)}/4"), ", ".join(f"{a} {b}" for a, b in worst))
res, nums = bd_steps(LAN512, "leave")
row("§6.4", "BD doubles every 13 members (leave as well as join)", "as the join row, on the 512-bit leave", res, nums)
ranks = {p: [] for p in PROTOS}
for D2 in (LAN512, LAN1024):
    for e2 in ("join", "leave", "partition", "merge"):
        for n in sizes(D2, e2):
            for i, p in enumerate(sorted(PROTOS, key=lambda p: t(D2, p, e2, n))):
                ranks[p].append(i + 1)
mean_rank = {p: statistics.mean(v) for p, v in ranks.items()}
best = min(mean_rank, key=mean_rank.get)
row("§6.4", "TGDH the best overall if one protocol must be chosen", "lowest mean rank over LAN join, leave, partition, merge (512 and 1024)",
    (best == "tgdh", ""), "mean rank " + ", ".join(f"{p.upper()} {r:.2f}" for p, r in sorted(mean_rank.items(), key=lambda x: x[1])))

print("| where | §6 says | criterion | data | agrees? |")
print("|---|---|---|---|---|")
for r in rows:
    print("| " + " | ".join(r) + " |")
yes = sum(r[4] == "yes" for r in rows)
print(f"\n{yes} of {len(rows)} statements agree.", file=sys.stderr)
