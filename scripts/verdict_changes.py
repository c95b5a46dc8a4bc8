"""What a change did to the verdicts: every claim's verdict at a git ref beside its verdict now.

    python scripts/verdict_changes.py REF [--out FILE]

Reads outputs/figures/NAME.claims.csv (the reproductions') at REF (git show) and in the work
tree, and prints (or writes) a markdown table: the verdict counts before and after, then one
row per claim whose verdict changed (figure, claim, was, now, and the rule that changed it, read
from the two verdicts' words). Nothing is typed by hand: rerun it to check the committed table.
"""

from __future__ import annotations

import argparse
import io
import subprocess
from collections import Counter
from pathlib import Path

import pandas as pd

from normlab.analysis.report import verdict_kind
from normlab.tables import markdown_table

REPO = Path(__file__).resolve().parents[1]
FIGURES = "outputs/figures"
NEW, GONE = "(new claim)", "(no longer a claim)"

# the rule a change of verdict comes from, by the words of the verdict before and after
RULES = (
    (lambda was, now: was == NEW, "new claim: a new grid, or its arms' gate rows re-collected"),
    (lambda was, now: now == GONE, "replaced: its arms' gate rows were re-collected"),
    (lambda was, now: now.split("; would decide it")[0] == was,
     "wording: an invalid verdict names what would decide it"),
    (lambda was, now: "budget-dependent" in now, "budget test (decaying schedule)"),
    (lambda was, now: now.startswith("absent"), "equivalence: two one-sided tests in a band"),
    (lambda was, now: "not past the boundary" in now, "sequential boundary (Pocock, 3 looks)"),
    (lambda was, now: "no events" in now, "a count with no events is not a test"),
    (lambda was, now: "the failure the claim tests" in now, "did-not-train answers the claim"),
    (
        lambda was, now: "saturated" in was and "saturated" not in now,
        "saturation one-sided (ceiling understates the claim)",
    ),
    (lambda was, now: "still improving" in was, "converged gate by schedule"),
    (lambda was, now: "not measured" in was, "gate rows re-collected / converged by schedule"),
    (
        lambda was, now: "seeds (cap" in was or "seeds (cap" in now,
        "seeds planned at the boundary's level",
    ),
)


def _claims(ref: str | None) -> dict[str, pd.DataFrame]:
    """Each reproduction's claims at a git ref (None: the work tree); a `--norm` comparison's or a
    report card's evidence (NAME+norm) is not a reproduction's, and is left out."""
    names = sorted(p.name for p in (REPO / FIGURES).glob("*.claims.csv") if "+" not in p.name)
    out = {}
    for name in names:
        path = f"{FIGURES}/{name}"
        if ref is None:
            text = (REPO / path).read_text()
        else:
            shown = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=REPO, text=True,
                                   capture_output=True)  # fmt: skip
            if shown.returncode:
                continue
            text = shown.stdout
        out[name.removesuffix(".claims.csv")] = pd.read_csv(io.StringIO(text))
    return out


def rule_of(was: str, now: str) -> str:
    """The rule whose words the new verdict (or the old one) carries."""
    return next((text for test, text in RULES if test(was, now)), "its number (new evidence)")


def table(ref: str) -> str:
    before, after = _claims(ref), _claims(None)
    count = [Counter(verdict_kind(v) for f in d.values() for v in f["verdict"])
             for d in (before, after)]  # fmt: skip
    kinds = sorted(set(count[0]) | set(count[1]))
    totals = [(k, count[0].get(k, 0), count[1].get(k, 0)) for k in kinds]
    totals.append(("all", sum(count[0].values()), sum(count[1].values())))
    rows = []
    for name, now in after.items():
        was = before.get(name, pd.DataFrame(columns=now.columns)).set_index("claim")["verdict"]
        for claim, verdict in zip(now["claim"], now["verdict"], strict=True):
            old = was.get(claim, NEW)
            if old != verdict:
                rows.append((name, claim, old, verdict, rule_of(old, verdict)))
        for claim, old in was.items():
            if claim not in set(now["claim"]):
                rows.append((name, claim, old, GONE, rule_of(old, GONE)))
    return "\n".join([
        f"Verdicts at {ref} and now (`python scripts/verdict_changes.py {ref}`).", "",
        markdown_table(["verdict", "was", "now"], totals), "",
        "The rule is read from the two verdicts' words; a claim whose arms ran new seeds since "
        "(the commits say which) can also have moved with its evidence.", "",
        markdown_table(["figure", "claim", "was", "now", "rule that changed it"], rows), "",
    ])  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="a git ref whose claims files are the 'before'")
    parser.add_argument("--out", type=Path, help="write the table here instead of printing")
    args = parser.parse_args()
    text = table(args.ref)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
