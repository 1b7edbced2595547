"""Can a stop/escalate rule that reads the first answers' texts beat one-round routers?

``benchmarks/adaptive_ceiling.py`` measured cascades that escalate on *disagreement* only. This
measures, on the same recorded answers (no LM), the richer rule issue 22 hopes a Conductor's
review could learn: after round 1 (one worker, or two in parallel; the round's answer is its
last step's, as on replay), estimate the chance that this answer is right from what came back,
and ask one more worker (round 2, whose answer is then final) only where the estimated gain pays
for its cost at the reward.

What the rule reads (:func:`text_features`, per answer of round 1): whether a final number was
extracted, the length, lines, the worker's calculator annotations (``<<6*3=18>>``) and inline
equations with their arithmetic re-checked (how many do not hold), whether the final number is an
integer, negative, copied from the question, the result of the text's last equation, hedging words
("I think", "approximately", "assume", ...), plus the agreement of the two first answers, and the
per-question evidence: every worker's probe estimate (``policies/evidence.py``, out of fold on
train). Two L2 logistic regressions on those (round 1's answer right; the escalation worker
right) give the estimated gain; the rule escalates where the gain in reward is above ``tau``.

Fitting, all on the training split: the probes' out-of-fold estimates as features; the two
logistic regressions' own out-of-fold predictions (5 folds) to choose ``tau`` at the reward;
then fitted on every training question and applied to test. Every (first round, escalation
worker) among the pool's workers is fitted; the one with the best out-of-fold train reward is
reported, plus its whole test frontier over ``tau``.

Compared on test with paired 95 % CIs (normal approximation over questions) against the
strongest one-round routers: the probe threshold router at the most cost not above the rule's
(``adaptive_ceiling``'s comparator), the one-round hull at its cost (chosen on test in
hindsight), and the routers fitted on train at the same reward (evidence router, kNN k=100,
the threshold router with its threshold fitted on train). Also the disagreement-only cascade
for reference. Writes ``benchmarks/results/adaptive_text.json``.

Usage::

    python benchmarks/adaptive_text.py --cost-weight 0.25
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import numpy as np
from _results import write_json
from adaptive_ceiling import WEIGHTS, Split, arguments, cascade, hull_at, routers, setting, summary
from adaptive_conductor import paired_ci
from numpy.typing import NDArray

from rl_conductor.policies.cascade import measure_samples
from rl_conductor.policies.evidence import estimated_rewards, fit_evidence
from rl_conductor.policies.knn import cached_embeddings
from rl_conductor.review_evidence import FEATURES, choose_tau, design, fit_probe, gain_of, text_features
from rl_conductor.reward import RewardConfig, reward_config, reward_of
from rl_conductor.tasks.datasets import load_tasks
from rl_conductor.tasks.gsm8k_six import RECORDINGS
from rl_conductor.tasks.recordings_format import load_recordings


def feature_table(s: Split, texts: dict[str, dict[str, str]]) -> NDArray[np.float64]:
    """``[questions, workers, features]`` of every recorded answer of a split."""
    out = np.zeros((len(s.tasks), len(s.names), len(FEATURES)))
    keys = s.keys
    for i, t in enumerate(s.tasks):
        for j, name in enumerate(s.names):
            out[i, j] = text_features(texts[t.id][name], keys[i][j], t.question)
    return out


def _design(f: NDArray[Any], agree: NDArray[Any], p: NDArray[Any], first: tuple[int, ...]) -> NDArray[Any]:
    """The library's review rows (:func:`rl_conductor.review_evidence.design`), one per question."""
    return np.stack(
        [
            design(
                [f[i, j] for j in first],
                bool(agree[i, first[0], first[-1]]) if len(first) == 2 else None,
                p[i],
            )
            for i in range(len(f))
        ]
    )


def _fit_predict(x: NDArray[Any], y: NDArray[Any], x_new: NDArray[Any], seed: int = 0) -> tuple[Any, Any]:
    """Out-of-fold predictions on ``x`` and the full fit's on ``x_new`` (:func:`fit_probe`)."""
    probe, oof = fit_probe(x, y, seed=seed)
    return oof, probe.predict(x_new)


def rule_outcome(
    s: Split, first: tuple[int, ...], esc: int, gain: NDArray[Any], tau: float
) -> dict[str, NDArray[Any]]:
    """Per question: correct, cost and escalated of the rule (escalate where ``gain > tau``)."""
    b = first[-1]
    cost = sum(s.cost[:, j] for j in first)
    go = gain > tau
    return {
        "correct": np.where(go, s.correct[:, esc], s.correct[:, b]),
        "cost": cost + np.where(go, s.cost[:, esc], 0.0),
        "escalated": go,
    }


def _ci(d: dict[str, float], scale: float, digits: int) -> str:
    return (
        f"{scale * d['mean']:+.{digits}f} [{scale * d['low']:+.{digits}f}, {scale * d['high']:+.{digits}f}]"
    )


def _reward(rc: RewardConfig, o: dict[str, NDArray[Any]]) -> float:
    return float(np.mean(reward_of(rc, correct=o["correct"], cost=o["cost"])))


def main() -> None:
    args = arguments(__doc__, 0.25, "adaptive_text.json").parse_args()
    t0 = time.process_time()
    rc, pool, dataset = setting(args)
    rec = load_recordings(RECORDINGS)
    data: dict[str, Split] = {}
    for split in ("train", "test"):
        tasks = load_tasks(dataset, split=split)
        out = asyncio.run(measure_samples(pool, tasks))
        data[split] = Split(tasks, out)
        data[split].keys = [[row[j][0] for j in range(len(out.names))] for row in out.keys]
    train, test = data["train"], data["test"]
    texts = {t.id: {m: (rec.get(t.id, m).text or "") for m in rec.models} for t in train.tasks + test.tasks}
    f_train, f_test = feature_table(train, texts), feature_table(test, texts)
    emb_train = cached_embeddings([t.question for t in train.tasks])
    emb_test = cached_embeddings([t.question for t in test.tasks])
    probe, p_train = fit_evidence(train.tasks, emb_train, train.names, train.correct, cost=train.cost)
    p_test = probe.predict(test.tasks, emb_test)
    w = len(train.names)
    preds = []  # per (first round, escalation worker): out-of-fold train and test estimates
    firsts = [(b,) for b in range(w)] + list(itertools.permutations(range(w), 2))
    for first in firsts:
        x_tr = _design(f_train, train.agree, p_train, first)
        x_te = _design(f_test, test.agree, p_test, first)
        s_tr, s_te = _fit_predict(x_tr, train.correct[:, first[-1]].astype(int), x_te)
        for esc in range(w):
            if esc not in first:
                e_tr, e_te = _fit_predict(x_tr, train.correct[:, esc].astype(int), x_te)
                preds.append((first, esc, s_tr, s_te, e_tr, e_te))

    def fit_at(cfg: RewardConfig) -> list[dict[str, Any]]:
        """Every rule's tau fitted on train at ``cfg``, best out-of-fold train reward first."""
        out = []
        for first, esc, s_tr, s_te, e_tr, e_te in preds:
            mean_esc_cost = float(train.cost[:, esc].mean())
            # the estimated reward gain of escalating (the cost term linear below its cap)
            g_tr = gain_of(cfg, s_tr, e_tr, mean_esc_cost)
            g_te = gain_of(cfg, s_te, e_te, mean_esc_cost)
            spent = sum(train.cost[:, j] for j in first)
            keep = reward_of(cfg, correct=train.correct[:, first[-1]], cost=spent)
            go = reward_of(cfg, correct=train.correct[:, esc], cost=spent + train.cost[:, esc])
            tau = choose_tau(g_tr, keep, go)
            out.append(
                {
                    "first": first,
                    "escalate": esc,
                    "tau": float(tau),
                    "train_reward": _reward(cfg, rule_outcome(train, first, esc, g_tr, tau)),
                    "g_test": g_te,
                }
            )
        out.sort(key=lambda f: -f["train_reward"])
        return out

    fits = fit_at(rc)
    best = fits[0]

    router_rows, threshold = routers(train, test, rc)
    points = [(r["mean_cost_usd"], r["accuracy"]) for r in router_rows]
    idx = np.arange(len(test.tasks))
    by_name = {r["policy"]: r for r in router_rows}

    # the threshold router with t fitted on train (out-of-fold probe estimates) at the reward
    strong, cheap = train.names.index(threshold["strong"]), train.names.index(threshold["cheap"])
    m_tr = p_train[:, strong] - p_train[:, cheap]
    m_te = p_test[:, strong] - p_test[:, cheap]
    rows_tr = np.arange(len(train.tasks))

    def thr_train_reward(t: float) -> float:
        ch = np.where(m_tr > t, strong, cheap)
        return float(np.mean(reward_of(rc, correct=train.correct[rows_tr, ch], cost=train.cost[rows_tr, ch])))

    t_fit = max(np.unique(np.concatenate([m_tr, [np.inf, -np.inf]])), key=thr_train_reward)
    thr_fit_choice = np.where(m_te > t_fit, strong, cheap)
    one_round_fitted = {
        f"evidence router w={args.cost_weight}": by_name[f"evidence w={args.cost_weight}"],
        f"knn k=100 w={args.cost_weight}": by_name[f"knn k=100 w={args.cost_weight}"],
        "threshold router, t fitted on train": summary(
            "threshold router, t fitted on train",
            test.correct[idx, thr_fit_choice],
            test.cost[idx, thr_fit_choice],
            rc,
        ),
    }
    per_question = {
        f"evidence router w={args.cost_weight}": None,
        "threshold router, t fitted on train": (
            test.correct[idx, thr_fit_choice],
            test.cost[idx, thr_fit_choice],
        ),
    }

    def compare(o: dict[str, NDArray[Any]]) -> dict[str, Any]:
        c = float(o["cost"].mean())
        fits_cost = [(float(test.cost[idx, ch].mean()), k) for k, ch in enumerate(threshold["choices"])]
        c_cost, k = max(x for x in fits_cost if x[0] <= c)
        ch = threshold["choices"][k]
        # the most accurate threshold router at or under the rule's cost, chosen on test (hindsight)
        under = [k2 for c2, k2 in fits_cost if c2 <= c]
        hb = threshold["choices"][
            max(under, key=lambda k2: (test.correct[idx, threshold["choices"][k2]].mean(), -k2))
        ]
        return {
            "accuracy": float(o["correct"].mean()),
            "mean_cost_usd": c,
            "mean_reward": _reward(rc, o),
            "escalated_rate": float(o["escalated"].mean()),
            "one_round_ceiling_accuracy": hull_at(points, c),
            "threshold_router_at_or_below": {
                "accuracy": float(test.correct[idx, ch].mean()),
                "mean_cost_usd": c_cost,
            },
            "accuracy_minus_threshold_router": paired_ci(o["correct"], test.correct[idx, ch]),
            "most_accurate_threshold_router_at_or_below_hindsight": {
                "accuracy": float(test.correct[idx, hb].mean()),
                "mean_cost_usd": float(test.cost[idx, hb].mean()),
            },
            "accuracy_minus_most_accurate_threshold_router": paired_ci(o["correct"], test.correct[idx, hb]),
        }

    def name(f: dict[str, Any]) -> str:
        return f"{' + '.join(train.names[j] for j in f['first'])} > {train.names[f['escalate']]}"

    result: dict[str, Any] = {
        "pool": args.pool,
        "cost_weight": args.cost_weight,
        "n_train": len(train.tasks),
        "n_test": len(test.tasks),
        "features": list(FEATURES),
    }
    o = rule_outcome(test, best["first"], best["escalate"], best["g_test"], best["tau"])
    result["text_rule_fitted"] = {
        "rule": name(best),
        "tau": best["tau"],
        "train_reward": best["train_reward"],
        **compare(o),
    }
    # reward comparisons vs routers fitted on train at the same reward (paired)
    rq = reward_of(rc, correct=o["correct"], cost=o["cost"])
    vs = {}
    ev = np.argmax(estimated_rewards(probe, test.tasks, p_test, rc), axis=1)
    per_question[f"evidence router w={args.cost_weight}"] = (test.correct[idx, ev], test.cost[idx, ev])
    for k, (corr, cost) in per_question.items():
        rr = reward_of(rc, correct=corr, cost=cost)
        vs[k] = {
            "reward": paired_ci(rq, rr),
            "accuracy": paired_ci(o["correct"], corr),
            "cost": paired_ci(o["cost"], cost),
        }
    result["text_rule_minus_fitted_routers"] = vs
    result["one_round_routers_fitted_on_train"] = one_round_fitted
    dis = cascade(
        test,
        (
            train.names.index("mixtral-8x7b-instruct"),
            train.names.index("gpt3-6b-finetuned"),
            train.names.index("gpt-4-1106-preview"),
        ),
    )
    result["disagreement_cascade"] = summary("disagreement cascade", dis["correct"], dis["cost"], rc)
    # the fitted rule's whole test frontier over tau: the largest margin over the one-round ceiling
    frontier = []
    for t in np.unique(np.quantile(best["g_test"], np.linspace(0, 1, 41))):
        ot = rule_outcome(test, best["first"], best["escalate"], best["g_test"], t - 1e-12)
        cmp = compare(ot)
        frontier.append(
            {
                "tau": float(t),
                **{k: cmp[k] for k in ("accuracy", "mean_cost_usd", "one_round_ceiling_accuracy")},
                "margin_over_ceiling": cmp["accuracy"] - cmp["one_round_ceiling_accuracy"],
            }
        )
    result["fitted_rule_test_frontier"] = frontier
    # the rule fitted on train at each cost weight: its test point against one-round routers
    sweep = []
    print(
        "\n| cost weight the rule is fitted at | rule | acc % | $/q | escalated % | "
        "threshold router at <= its cost: acc %, $/q | rule minus it, points [95 % CI] | "
        "one-round ceiling, acc % | rule minus the most accurate threshold router at <= its cost "
        "(hindsight), points [95 % CI] |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for wt in WEIGHTS:
        f = fit_at(reward_config(rc, cost_weight=wt))[0]
        cmp = compare(rule_outcome(test, f["first"], f["escalate"], f["g_test"], f["tau"]))
        sweep.append({"cost_weight": wt, "rule": name(f), **cmp})
        d, tr = cmp["accuracy_minus_threshold_router"], cmp["threshold_router_at_or_below"]
        print(
            f"| {wt} | {name(f)} | {100 * cmp['accuracy']:.1f} | {cmp['mean_cost_usd']:.6f} "
            f"| {100 * cmp['escalated_rate']:.0f} | {100 * tr['accuracy']:.1f}, {tr['mean_cost_usd']:.6f} "
            f"| {100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] "
            f"| {100 * cmp['one_round_ceiling_accuracy']:.1f} "
            f"| {_ci(cmp['accuracy_minus_most_accurate_threshold_router'], 100, 1)} |"
        )
    result["cost_weight_sweep"] = sweep
    result["top_rules_by_train_reward"] = [
        {
            "rule": name(f),
            "train_reward": f["train_reward"],
            **{
                k: v
                for k, v in compare(
                    rule_outcome(test, f["first"], f["escalate"], f["g_test"], f["tau"])
                ).items()
                if k in ("accuracy", "mean_cost_usd", "mean_reward", "escalated_rate")
            },
        }
        for f in fits[:8]
    ]
    r = result["text_rule_fitted"]
    print(f"test n={len(test.tasks)}, w={args.cost_weight}; rules fitted on train n={len(train.tasks)}")
    print(
        f"fitted text rule {r['rule']} tau={r['tau']:.4f}: {100 * r['accuracy']:.1f} % "
        f"${r['mean_cost_usd']:.6f} reward {r['mean_reward']:.4f} escalated {100 * r['escalated_rate']:.0f} %"
    )
    tr0 = r["threshold_router_at_or_below"]
    print(
        f"  vs threshold router at <= cost ({100 * tr0['accuracy']:.1f} % ${tr0['mean_cost_usd']:.6f}): "
        f"{_ci(r['accuracy_minus_threshold_router'], 100, 1)} points; "
        f"ceiling {100 * r['one_round_ceiling_accuracy']:.1f} %"
    )
    for k, v in vs.items():
        print(f"  minus {k}: reward {_ci(v['reward'], 1, 4)}, acc {_ci(v['accuracy'], 100, 1)}")
    for k, v in one_round_fitted.items():
        print(f"  {k}: {100 * v['accuracy']:.1f} % ${v['mean_cost_usd']:.6f} reward {v['mean_reward']:.4f}")
    print(f"  disagreement cascade: {result['disagreement_cascade']}")
    for tr in result["top_rules_by_train_reward"]:
        print("  ", tr)
    print("frontier max margin:", max(frontier, key=lambda x: x["margin_over_ceiling"]))
    result["cpu_seconds"] = time.process_time() - t0
    write_json(args.out, "adaptive_text", result)
    print(f"wrote {args.out} ({result['cpu_seconds']:.0f} CPU s)")


if __name__ == "__main__":
    main()
