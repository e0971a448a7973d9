"""report.py's figures: the numbers of the runs, as the figures show them (the curves over seeds and their bands,
the legends, the data-scale study's error bars, the language models' per-position profiles), read back from the
matplotlib objects (conftest's `drawn`: nothing is written)."""

import numpy as np
import pytest
from matplotlib.colors import to_rgba

import report


def test_a_curve_is_the_mean_over_seeds_where_every_seed_measured_with_a_std_band():
    """plot_curves: the mean over seeds at the x every seed measured (a None is not a measurement), +-1 std band in
    the line's colour; one seed, no band; no common x, no line."""
    plt = report.pyplot()
    hists = [[{"step": 0, "sens": 0.1}, {"step": 1, "sens": 0.3}, {"step": 2, "sens": 0.5}, {"step": 3, "sens": 0.7}],
             [{"step": 0, "sens": 0.3}, {"step": 2, "sens": 0.9}, {"step": 3, "sens": None}, {"step": 4, "sens": 1.0}]]
    fig, axes = plt.subplots(1, 3)
    report.plot_curves(axes[0], hists, "step", "sens", "vit (2 seeds)", color="C3")
    line, = axes[0].lines
    assert list(line.get_xdata()) == [0, 2] and np.allclose(line.get_ydata(), [0.2, 0.7])
    assert line.get_label() == "vit (2 seeds)" and line.get_color() == "C3"
    band, = axes[0].collections  # mean - std to mean + std: 0.1-0.3 at step 0, 0.5-0.9 at step 2
    corners = {(round(x, 6), round(y, 6)) for x, y in band.get_paths()[0].vertices}
    assert {(0, 0.1), (0, 0.3), (2, 0.5), (2, 0.9)} <= corners and {y for _, y in corners} <= {0.1, 0.3, 0.5, 0.9}
    assert np.allclose(band.get_facecolor()[0], to_rgba("C3", 0.2))
    report.plot_curves(axes[1], hists[:1], "step", "sens", "one seed")
    assert list(axes[1].lines[0].get_xdata()) == [0, 1, 2, 3] and not axes[1].collections
    report.plot_curves(axes[2], [[{"step": 0, "sens": None}], hists[0]], "step", "sens", "none")
    report.plot_curves(axes[2], [], "step", "sens", "no runs")
    assert not axes[2].lines and not axes[2].collections
    plt.close(fig)


def test_a_panel_has_a_legend_of_its_labelled_curves_or_says_nothing_was_measured():
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 4)
    axes[0].plot([0, 1], [0, 1], label="vit")
    axes[1].plot([0, 1], [0, 1])  # a line without a label (grokking's later seeds, parity's k)
    axes[3].fill_between([0, 1], [0, 1], [1, 2])
    for ax in axes:
        report.legend(ax)
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == ["vit"]
    assert [ax.get_legend() for ax in axes[1:]] == [None, None, None]
    assert [[t.get_text() for t in ax.texts] for ax in axes] == [[], [], ["not measured yet"], []]
    plt.close(fig)


def test_the_data_scale_figure_gives_each_size_its_paired_difference_and_standard_error(tmp_path, drawn):
    """draw_data_scale: one panel per measurement made at two sizes or more, one curve per model against the
    reference, sizes in numeric order on a log axis; the error bar is the s.e. over seeds, that seed's s.e. over
    images where one seed ran, and none where neither is known."""
    d = lambda mean, se, per_seed: {"mean": mean, "stderr": se, "seeds": len(per_seed), "per_seed": per_seed}
    two = {"seed0": [0.1, 0.01], "seed1": [0.3, 0.01]}
    scale = {"600": {"reference": "vit", "models": {
                 "mlp": {"diff": {"patch:0.1": d(0.2, 0.05, two), "patch:1": d(0.5, 0.1, two)}},
                 "cnn": {"diff": {"patch:0.1": d(-0.1, None, two)}}}},  # (NaN on disk is null)
             "90": {"reference": "vit",
                    "models": {"mlp": {"diff": {"patch:0.1": d(0.4, float("nan"), {"seed0": [0.4, 0.03]})}},
                               "cnn": {"diff": {"patch:0.1": d(0.3, None, {"seed0": [0.3, 0.02]})}}}},
             "30": {}}  # a size with nothing paired yet
    plt = report.pyplot()
    assert report.draw_data_scale(scale, str(tmp_path), plt) == f"{tmp_path}/data_scale.png"
    ax, = drawn[0].axes  # patch:1 was measured at one size only
    assert ax.get_title() == "patch:0.1" and ax.get_xscale() == "log"
    bars = {c.get_label(): c for c in ax.containers}
    assert list(bars) == ["mlp - vit", "cnn - vit"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["mlp - vit", "cnn - vit"]
    for name, xs, ys, errors in [("mlp - vit", [90, 600], [0.4, 0.2], [0.03, 0.05]),
                                 ("cnn - vit", [90, 600], [0.3, -0.1], [0.02, 0])]:  # one seed: NaN or null
        line, _, (segments,) = bars[name].lines
        assert list(line.get_xdata()) == xs and np.allclose(line.get_ydata(), ys)
        assert np.allclose([(top - bottom) / 2 for (_, bottom), (_, top) in segments.get_segments()], errors), name
    report.draw_data_scale({"600": scale["600"]}, str(tmp_path), plt)  # one size: every measurement has a panel
    assert [ax.get_title() for ax in drawn[1].axes] == ["patch:0.1", "patch:1"]


def test_the_position_figure_averages_the_seeds_that_measured_each_position(tmp_path, drawn):
    """report.draw_language: sensitivity through training against the examples seen, and per alignment the final
    models' per-position profile, the mean over the seeds that reached each position (None: no pair reached it),
    drawn where at least a quarter of the most-reached position's pairs reach, at positions counted back from the last
    token (right) or on from <s> (left), beside the pairs reaching each position (the twin axis, every position)."""
    def run(model, seed, right, left=None):
        hist = [{"step": s, "examples": 10 * s, "sens": 0.1 * s, "train_acc": 0.5, "test_acc": 0.5} for s in range(3)]
        profiles = {"right": {"sens": right, "pairs": [1, 2, 4, 8]}}
        if left:
            profiles["left"] = {"sens": left, "pairs": [8, 4, 2, 1]}
        return {"model": model, "seed": seed, "history": hist, "final": {"profiles": profiles}}

    data = {"script": "language", "runs": {
        "roberta/seed0": run("roberta", 0, [0.5, None, 0.3, 0.1], [0.2, 0.4, 0.6, 0.8]),
        "roberta/seed1": run("roberta", 1, [0.7, 0.2, None, 0.3], [0.4, 0.6, 0.8, None]),
        "lstm/seed0": run("lstm", 0, [0.9, 0.9, 0.9, 0.9])}}  # measured right-aligned alone
    paths = report.draw(data, str(tmp_path))
    assert paths == [f"{tmp_path}/sensitivity.png", f"{tmp_path}/sensitivity_by_position.png"]
    sens = drawn[0].axes[0]
    assert sens.get_xlabel() == "training examples seen" and list(sens.lines[0].get_xdata()) == [0, 10, 20]
    right, left, right_pairs, left_pairs = drawn[1].axes
    assert [right.get_title(), left.get_title()] == ["right-aligned", "left-aligned"]
    curves = {ax.get_title(): {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}
              for ax in (right, left)}
    assert curves["right-aligned"].keys() == {"roberta (2 seeds)", "lstm (1 seed)"}
    xs, ys = curves["right-aligned"]["roberta (2 seeds)"]  # positions -3 and -2 reached by 1 and 2 of 8 pairs
    assert xs == [-2, -1, 0] and ys == pytest.approx([0.2, 0.3, 0.2])
    assert list(curves["left-aligned"]) == ["roberta (2 seeds)"]
    xs, ys = curves["left-aligned"]["roberta (2 seeds)"]
    assert xs == [0, 1, 2] and ys == pytest.approx([0.3, 0.5, 0.7])
    assert [list(ax.lines[0].get_xdata()) for ax in (right_pairs, left_pairs)] == [[-3, -2, -1, 0], [0, 1, 2, 3]]
    assert [list(ax.lines[0].get_ydata()) for ax in (right_pairs, left_pairs)] == [[1, 2, 4, 8], [8, 4, 2, 1]]
