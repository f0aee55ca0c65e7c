"""Bootstrap intervals and paired differences (mia.eval.stats)."""

from __future__ import annotations

import math

from mia.eval.stats import bootstrap_ci, comparison, format_comparison, paired_bootstrap_ci


def test_bootstrap_interval_brackets_the_mean_and_narrows_with_n() -> None:
    mean, lo, hi = bootstrap_ci([1, 0] * 10)
    assert mean == 0.5 and lo < 0.5 < hi and hi - lo < 0.5
    _, lo2, hi2 = bootstrap_ci([1, 0] * 200)
    assert hi2 - lo2 < (hi - lo) / 3  # ~ 1/sqrt(n)
    assert bootstrap_ci([1, 1, 1]) == (1.0, 1.0, 1.0)
    assert all(math.isnan(x) for x in bootstrap_ci([]))


def test_paired_difference_sees_what_two_intervals_would_not() -> None:
    a = [1.0] * 12 + [0.0] * 28  # 30% vs 20%: overlapping intervals ...
    b = [1.0] * 8 + [0.0] * 32
    d, lo, hi = paired_bootstrap_ci(a, b)  # ... but a is never worse on any question
    assert math.isclose(d, 0.1) and lo > 0
    rows = comparison({"none": dict(enumerate(b)), "mia": dict(enumerate(a))}, groups={0: "x"})
    assert rows[0]["policy"] == "none" and "delta" not in rows[0]
    assert math.isclose(rows[1]["delta"]["mean"], 0.1) and rows[1]["delta"]["ci"][0] > 0
    assert rows[1]["groups"]["x"] == {"n": 1, "accuracy": 1.0}
    text = format_comparison(rows, {"mia": {"tools": 1.5, "tokens": 900, "seconds": 2.0}})
    assert text.splitlines()[0].startswith("policy") and "+10.0" in text


def test_cluster_bootstrap_resamples_linked_questions_together() -> None:
    from mia.eval.stats import cluster_bootstrap_ci, paired_cluster_bootstrap_ci

    # Ten clusters of ten questions: each cluster all right or all wrong (fully linked).
    values = [float(c % 2) for c in range(10) for _ in range(10)]
    clusters = [c for c in range(10) for _ in range(10)]
    mean, lo, hi = cluster_bootstrap_ci(values, clusters)
    _, ilo, ihi = bootstrap_ci(values)  # as if the 100 were independent
    assert mean == 0.5 and (hi - lo) > 2.5 * (ihi - ilo)
    # One question per cluster: the same as the plain bootstrap.
    assert cluster_bootstrap_ci([1, 0, 1, 1], [0, 1, 2, 3]) == bootstrap_ci([1, 0, 1, 1])
    d = paired_cluster_bootstrap_ci([1.0] * 4, [0.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"])
    assert d[0] == 0.5 and d[1] == d[2] == 0.5  # every resample holds the same mix


def test_comparison_with_clusters_resamples_templates_together() -> None:
    """``clusters`` (question id -> template): the table's intervals are clustered; the means
    stay per question."""
    from mia.eval.stats import cluster_bootstrap_ci, paired_cluster_bootstrap_ci

    none = {i: float(i % 4 == 0) for i in range(20)}
    mia = {i: float(i < 10) for i in range(20)}
    clusters = {i: f"t{i // 5}" for i in range(20)}  # four templates of five questions
    rows = comparison({"none": none, "mia": mia}, clusters=clusters)
    labels = [clusters[i] for i in sorted(none)]
    mean, lo, hi = cluster_bootstrap_ci([mia[i] for i in sorted(mia)], labels)
    assert rows[1]["accuracy"] == mean == 0.5 and rows[1]["ci"] == [lo, hi]
    d = paired_cluster_bootstrap_ci(
        [mia[i] for i in sorted(mia)], [none[i] for i in sorted(none)], labels
    )
    assert rows[1]["delta"] == {"vs": "none", "mean": d[0], "ci": [d[1], d[2]]}
    plain = comparison({"none": none, "mia": mia})
    assert plain[1]["accuracy"] == 0.5 and plain[1]["ci"] != rows[1]["ci"]
