"""report.py's figures: the numbers of the runs, as the figures show them (the curves over seeds and their bands,
the legends, the data-scale study's error bars, the language models' per-position profiles), read back from the
matplotlib objects (conftest's `drawn`: nothing is written)."""

import os
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.colors import to_rgba

import report


def curves(ax):
    """{label: (x, y)} of a panel's lines."""
    return {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines}


def corners(band):
    """The (x, y) corners of a fill_between band, rounded."""
    return {(round(x, 6), round(y, 6)) for x, y in band.get_paths()[0].vertices}


def legend_texts(ax):
    return [t.get_text() for t in ax.get_legend().get_texts()]


def in_a_row(axes):
    """Panels side by side, left to right in the order given (a figure's 1 x n grid, not n x 1)."""
    boxes = [ax.get_position() for ax in axes]
    return len({round(b.y0, 6) for b in boxes}) == 1 and all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))


def named(ax):
    """A panel's title and axis labels: what a reader is told it shows."""
    return ax.get_title(), ax.get_xlabel(), ax.get_ylabel()


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
    assert {(0, 0.1), (0, 0.3), (2, 0.5), (2, 0.9)} <= corners(band)
    assert {y for _, y in corners(band)} <= {0.1, 0.3, 0.5, 0.9}
    assert np.allclose(band.get_facecolor()[0], to_rgba("C3", 0.2))
    report.plot_curves(axes[1], hists[:1], "step", "sens", "one seed")
    assert list(axes[1].lines[0].get_xdata()) == [0, 1, 2, 3] and not axes[1].collections
    report.plot_curves(axes[2], [[{"step": 0, "sens": None}], hists[0]], "step", "sens", "none")
    report.plot_curves(axes[2], [], "step", "sens", "no runs")
    assert not axes[2].lines and not axes[2].collections
    plt.close(fig)


def test_figures_are_drawn_on_agg_whatever_backend_the_user_has_set():
    """A user's MPLBACKEND (a notebook's, a desktop's) does not reach report.py's figures: they are files, drawn on
    Agg, which needs no display."""
    code = "import report; print(report.pyplot().get_backend())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "MPLBACKEND": "svg"}, capture_output=True,
                         text=True, check=True, cwd=os.path.dirname(os.path.abspath(report.__file__)))
    assert out.stdout.strip().lower() == "agg"


def test_a_figure_is_laid_out_written_as_a_png_at_110_dpi_and_closed(tmp_path):
    """save_figure: the panels are laid out to fit their labels, the PNG has the figure's size at 110 dots per inch,
    the figure is closed (a script drawing many figures keeps none open) and the path is returned."""
    plt = report.pyplot()
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set_ylabel("sensitivity\n(flip rate)")
    before = ax.get_position().bounds
    path = str(tmp_path / "fig.png")
    assert report.save_figure(fig, path) == path
    assert ax.get_position().bounds != before and not plt.fignum_exists(fig.number)
    with open(path, "rb") as fh:
        header = fh.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")) == (440, 330)


def test_a_panel_has_a_legend_of_its_labelled_curves_or_says_nothing_was_measured():
    plt = report.pyplot()
    fig, axes = plt.subplots(1, 4)
    axes[0].plot([0, 1], [0, 1], label="vit")
    axes[1].plot([0, 1], [0, 1])  # a line without a label (grokking's later seeds, parity's k)
    axes[3].fill_between([0, 1], [0, 1], [1, 2])
    for ax in axes:
        report.legend(ax)
    assert legend_texts(axes[0]) == ["vit"]
    assert [ax.get_legend() for ax in axes[1:]] == [None, None, None]
    assert [[t.get_text() for t in ax.texts] for ax in axes] == [[], [], ["not measured yet"], []]
    assert axes[2].texts[0].get_transform() is axes[2].transAxes  # the panel's middle, whatever its axes' limits
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
    assert named(ax) == ("patch:0.1", "training images", "paired sensitivity difference (mean +- s.e.)")
    assert ax.get_xscale() == "log"
    bars = {c.get_label(): c for c in ax.containers}
    assert list(bars) == ["mlp - vit", "cnn - vit"]
    assert legend_texts(ax) == ["mlp - vit", "cnn - vit"]
    zero, = [ln for ln in ax.lines if ln.get_linestyle() == "-" and ln.get_color() == "gray"]  # where the sign changes
    assert list(zero.get_ydata()) == [0, 0]
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
    assert in_a_row(drawn[0].axes)
    assert [named(ax) for ax in drawn[0].axes] == [(title, "training examples seen", "") for title in
                                                   ["sensitivity (train subset)", "train accuracy", "test accuracy"]]
    assert list(sens.lines[0].get_xdata()) == [0, 10, 20]
    assert [legend_texts(ax) for ax in drawn[0].axes] == [["roberta (2 seeds)", "lstm (1 seed)"]] * 3
    right, left, right_pairs, left_pairs = drawn[1].axes
    assert in_a_row([right, left])
    assert [named(right), named(left)] == [
        ("right-aligned", "position counted from the last token (0)", "sensitivity at that position"),
        ("left-aligned", "position from <s> (0)", "sensitivity at that position")]
    assert [ax.get_ylabel() for ax in (right_pairs, left_pairs)] == ["pairs reaching the position (dotted)"] * 2
    drawn_right, drawn_left = curves(right), curves(left)
    assert drawn_right.keys() == {"roberta (2 seeds)", "lstm (1 seed)"}
    xs, ys = drawn_right["roberta (2 seeds)"]  # positions -3 and -2 reached by 1 and 2 of 8 pairs
    assert xs == [-2, -1, 0] and ys == pytest.approx([0.2, 0.3, 0.2])
    assert list(drawn_left) == ["roberta (2 seeds)"]
    xs, ys = drawn_left["roberta (2 seeds)"]
    assert xs == [0, 1, 2] and ys == pytest.approx([0.3, 0.5, 0.7])
    assert [legend_texts(right), legend_texts(left)] == [["roberta (2 seeds)", "lstm (1 seed)"], ["roberta (2 seeds)"]]
    assert [list(ax.lines[0].get_xdata()) for ax in (right_pairs, left_pairs)] == [[-3, -2, -1, 0], [0, 1, 2, 3]]
    assert [list(ax.lines[0].get_ydata()) for ax in (right_pairs, left_pairs)] == [[1, 2, 4, 8], [8, 4, 2, 1]]


def test_the_vision_figures_draw_each_run_the_sweep_over_seeds_and_the_patch_maps(tmp_path, drawn):
    """draw_vision: sensitivity against train accuracy, one line per run in its model's colour, at the evaluations
    that measured it; the sigma sweep per mask, the mean over seeds with their range as the band, a model only where
    it was measured; each run's per-patch map as measured, side by side."""
    def run(model, seed, sens, finals, sens_map=None):
        hist = [{"epoch": e, "train_acc": a, "test_acc": 0.5, **({"sens": s} if s is not None else {})}
                for e, (a, s) in enumerate(zip([0.2, 0.5, 0.9], sens))]
        final = {"sens_at": {k: {"sens": v, "stderr": 0.01} for k, v in finals.items()}}
        if sens_map:
            final["sens_map"] = sens_map
        return {"model": model, "seed": seed, "history": hist, "final": final}

    data = {"script": "vision", "args": {"mask": ["patch"], "sigma": [0.1, 1.0]}, "runs": {
        "vit/seed0": run("vit", 0, [0.1, None, 0.3], {"patch:0.1": 0.1, "patch:1": 0.3, "scattered:1": 0.2},
                         [[0.1, 0.2], [0.3, 0.4]]),
        "vit/seed1": run("vit", 1, [0.2, 0.4, 0.6], {"patch:0.1": 0.2, "patch:1": 0.7, "scattered:1": 0.4},
                         [[0.5, 0.6], [0.7, 0.9]]),
        "mlp/seed0": run("mlp", 0, [0.5, 0.6, 0.7], {"patch:0.1": 0.6, "patch:1": 0.8})}}
    paths = report.draw(data, str(tmp_path))
    assert [p.rpartition("/")[2] for p in paths] == ["sensitivity.png", "sensitivity_vs_train_acc.png",
                                                     "sigma_sweep.png", "sensitivity_maps.png"]
    assert [legend_texts(ax) for ax in drawn[0].axes] == [["vit (2 seeds)", "mlp (1 seed)"]] * 3
    assert in_a_row(drawn[0].axes)
    assert [named(ax) for ax in drawn[0].axes] == [(title, "epoch", "") for title in
                                                   ["sensitivity (train subset)", "train accuracy", "test accuracy"]]
    ax, = drawn[1].axes
    assert named(ax) == ("", "train accuracy", "sensitivity (patch, sigma 0.1)")
    assert [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in ax.lines] == [
        ([0.2, 0.9], [0.1, 0.3]), ([0.2, 0.5, 0.9], [0.2, 0.4, 0.6]), ([0.2, 0.5, 0.9], [0.5, 0.6, 0.7])]
    assert [ln.get_color() for ln in ax.lines] == ["C0", "C0", "C1"]
    assert legend_texts(ax) == ["vit", "mlp"]
    patch, scattered = drawn[2].axes
    assert in_a_row([patch, scattered])
    assert [named(patch), named(scattered)] == [
        (f"{mask} mask (band: range over seeds)", "sigma (noise std on normalised pixels)", "sensitivity")
        for mask in ["patch", "scattered"]]
    assert patch.get_xscale() == scattered.get_xscale() == "log"  # sigmas a decade apart
    sweep, sweep_scattered = curves(patch), curves(scattered)
    assert sweep.keys() == {"vit (2 seeds)", "mlp (1 seed)"}
    assert sweep["vit (2 seeds)"][0] == [0.1, 1.0] and np.allclose(sweep["vit (2 seeds)"][1], [0.15, 0.5])
    assert sweep["mlp (1 seed)"] == ([0.1, 1.0], [0.6, 0.8])
    assert list(sweep_scattered) == ["vit (2 seeds)"] and np.allclose(sweep_scattered["vit (2 seeds)"][1], 0.3)
    assert [legend_texts(patch), legend_texts(scattered)] == [["vit (2 seeds)", "mlp (1 seed)"], ["vit (2 seeds)"]]
    band, = patch.collections  # the vit's range over its two seeds (not over sigmas); the one-seed mlp has none
    assert {(0.1, 0.1), (0.1, 0.2), (1, 0.3), (1, 0.7)} <= corners(band)
    assert {y for _, y in corners(band)} <= {0.1, 0.2, 0.3, 0.7}
    image_ax, image_ax1, colour_bar, colour_bar1 = drawn[3].axes  # a map has no axes to read, its colour bar the scale
    assert in_a_row([image_ax, image_ax1])
    assert image_ax.get_title() == "vit/seed0" and np.allclose(image_ax.images[0].get_array(), [[0.1, 0.2],
                                                                                                [0.3, 0.4]])
    assert image_ax1.get_title() == "vit/seed1" and np.allclose(image_ax1.images[0].get_array(), [[0.5, 0.6],
                                                                                                  [0.7, 0.9]])
    assert list(image_ax.get_xticks()) == list(image_ax.get_yticks()) == []
    assert colour_bar.get_ylim() == pytest.approx((0.1, 0.4)) and colour_bar1.get_ylim() == pytest.approx((0.5, 0.9))


def test_the_robustness_figures_give_each_model_its_means_over_severities_and_seeds(tmp_path, drawn):
    """draw_robustness: one bar per corruption and model, the mean over severities and then seeds, the model's mean
    sensitivity in its label; sensitivity against mean corruption accuracy, one point per seed and the mean +- s.e.;
    sensitivity through training."""
    def run(model, seed, acc, sens, mean_acc):
        hist = [{"epoch": e, "sens": sens * e} for e in range(3)]
        return {"model": model, "seed": seed, "history": hist,
                "final": {"corruption_acc": acc, "sens": sens, "mean_corruption_acc": mean_acc}}

    data = {"script": "robustness", "runs": {
        "vit-vanilla/seed0": run("vit-vanilla", 0, {"fog": {"1": 0.8, "5": 0.4}, "motion_blur": {"1": 0.5, "5": 0.5}},
                                 0.2, 0.6),
        "vit-vanilla/seed1": run("vit-vanilla", 1, {"fog": {"1": 0.6, "5": 0.2}, "motion_blur": {"1": 0.3, "5": 0.1}},
                                 0.4, 0.3),
        "vit-reg/seed0": run("vit-reg", 0, {"fog": {"1": 0.9, "5": 0.7}, "motion_blur": {"1": 0.6, "5": 0.4}},
                             0.1, 0.7)}}
    paths = report.draw(data, str(tmp_path))
    assert [p.rpartition("/")[2] for p in paths] == ["corruptions.png", "sensitivity_vs_robustness.png",
                                                     "sensitivity.png"]
    ax, = drawn[0].axes
    assert named(ax) == ("", "", "test accuracy (mean over severities)")  # the corruptions name the ticks
    bars = {c.get_label(): c for c in ax.containers}
    assert list(bars) == ["vit-vanilla (sens 0.3000, 2 seeds)", "vit-reg (sens 0.1000, 1 seed)"] == legend_texts(ax)
    assert np.allclose([b.get_height() for b in bars["vit-vanilla (sens 0.3000, 2 seeds)"]], [0.5, 0.35])
    assert np.allclose([b.get_height() for b in bars["vit-reg (sens 0.1000, 1 seed)"]], [0.8, 0.5])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fog", "motion\nblur"]  # a name's _ breaks its line
    assert np.allclose(ax.get_xticks(), [0.2, 1.2])
    centres = [[b.get_x() + b.get_width() / 2 for b in c] for c in ax.containers]  # side by side at each corruption
    assert np.allclose(centres, [[0, 1], [0.4, 1.4]]) and {b.get_width() for c in ax.containers for b in c} == {0.4}
    ax, = drawn[1].axes
    assert np.allclose(ax.collections[0].get_offsets(), [[0.2, 0.6], [0.4, 0.3]])
    (point, _, (xerr, yerr)), (reg_point, _, (reg_xerr, _)) = (c.lines for c in ax.containers)
    half = lambda bars: [np.ptp(segment, axis=0).max() / 2 for segment in bars.get_segments()]  # an error bar's
    assert np.allclose(point.get_xydata(), [[0.3, 0.45]]) and point.get_marker() == "o"
    assert np.allclose(half(xerr), [0.1]) and np.allclose(half(yerr), [0.15])  # std (ddof 1) / sqrt(2 seeds)
    assert np.allclose(reg_point.get_xydata(), [[0.1, 0.7]]) and np.allclose(half(reg_xerr), [0])  # one seed
    assert legend_texts(ax) == ["vit-vanilla (2 seeds)", "vit-reg (1 seed)"]
    assert named(ax) == ("", "sensitivity (train subset)",
                         "mean corruption accuracy (15 standard)")  # a run that does not say: all 15
    ax, = drawn[2].axes
    assert named(ax) == ("", "epoch", "sensitivity")
    assert [ln.get_label() for ln in ax.lines] == ["vit-vanilla", "vit-reg"] == legend_texts(ax)
    assert np.allclose(ax.lines[0].get_ydata(), [0, 0.3, 0.6])


def test_the_robustness_figures_of_the_extra_corruptions_alone_leave_out_the_standard_mean(tmp_path, drawn):
    """A run measured on the extra corruptions alone (`--corruptions speckle_noise`) has no mean over the standard
    ones (null): no sensitivity-against-robustness figure, the other two as usual. Without frost the mean is over 14,
    and the axis says so."""
    def run(seed, mean_acc, standard):
        return {"model": "vit-vanilla", "seed": seed, "history": [{"epoch": 0, "sens": 0.1}],
                "final": {"corruption_acc": {"speckle_noise": {"1": 0.5}}, "sens": 0.2, "mean_corruption_acc": mean_acc,
                          "standard_measured": standard}}
    extra = {"script": "robustness", "runs": {f"vit-vanilla/seed{i}": run(i, None, 0) for i in range(2)}}
    paths = report.draw(extra, str(tmp_path / "extra"))
    assert [p.rpartition("/")[2] for p in paths] == ["corruptions.png", "sensitivity.png"]
    no_frost = {"script": "robustness", "runs": {f"vit-vanilla/seed{i}": run(i, 0.5, 14) for i in range(2)}}
    paths = report.draw(no_frost, str(tmp_path / "no-frost"))
    assert paths[1].endswith("sensitivity_vs_robustness.png")
    assert drawn[3].axes[0].get_ylabel() == "mean corruption accuracy (14 standard)"


def test_the_synthetic_and_parity_figures_give_each_setting_a_column_of_its_seeds(tmp_path, drawn):
    """draw_synthetic: one column per preset, its four rows (accuracy, alignments, attention mass, sensitivities)
    with three curves each, the mean over the preset's seeds; draw_parity: the same per setting, with k marked."""
    keys = ["train_acc", "test_acc", "ood_acc", "align_sparse", "align_frequent", "align_irrelevant", "att_sparse",
            "att_frequent", "att_irrelevant", "sens", "sens_sparse_fn", "sens_frequent_fn"]
    hist = lambda v: [{"step": t, **{k: v * (i + 1) * t for i, k in enumerate(keys)}} for t in range(3)]
    runs = {"sparse-lower/seed0": {"model": "sparse-lower", "seed": 0, "history": hist(0.01), "final": {}},
            "sparse-lower/seed1": {"model": "sparse-lower", "seed": 1, "history": hist(0.03), "final": {}},
            "frequent-lower/seed0": {"model": "frequent-lower", "seed": 0, "history": hist(0.05), "final": {}}}
    report.draw({"script": "synthetic", "runs": runs}, str(tmp_path))
    axes = drawn[0].axes
    assert len(axes) == 8 and [ax.get_title() for ax in axes[:2]] == ["sparse-lower (2 seeds)",
                                                                      "frequent-lower (1 seed)"]
    assert [ax.get_xlabel() for ax in axes] == [""] * 6 + ["SGD step"] * 2  # under the last row (a shared x)
    rows = [axes[2 * i] for i in range(4)]  # the first column, top to bottom
    assert [ax.get_ylabel() for ax in rows] == ["accuracy", "head alignment (cos)", "attention mass", "sensitivity"]
    assert [[ln.get_label() for ln in ax.lines] for ax in rows] == [
        ["train", "test", "OOD test"], ["v_sparse", "v_frequent", "v_irrelevant"],
        ["sparse", "frequent", "irrelevant"], ["model", "sparse vote", "frequent vote"]] == [
        legend_texts(ax) for ax in rows]
    for i, line in enumerate(ln for ax in rows for ln in ax.lines):  # key i: 0.02 (i + 1) t, the mean of the seeds
        assert np.allclose(line.get_ydata(), [0, 0.02 * (i + 1), 0.04 * (i + 1)]), keys[i]
    assert np.allclose(axes[7].lines[2].get_ydata(), [0, 0.6, 1.2])  # frequent-lower's frequent vote

    parity_hist = [{"step": t, "train_acc": 0.5, "test_acc": 0.6, "sens_count": 0.2 * t, "sens_relevant": 0.5}
                   for t in (0, 10)]
    runs = {"setting1/seed0": {"model": "setting1", "seed": 0, "history": parity_hist, "final": {}}}
    report.draw({"script": "parity", "args": {"k": 3}, "runs": runs}, str(tmp_path))
    accuracy, sens = drawn[1].axes
    assert named(accuracy) == ("setting1 (1 seed)", "", "accuracy")  # its x label under the panel below
    assert [ln.get_label() for ln in accuracy.lines] == ["train", "test"]
    assert [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in accuracy.lines] == [([0, 10], [0.5, 0.5]),
                                                                                      ([0, 10], [0.6, 0.6])]
    assert [list(ln.get_xdata()) for ln in sens.lines[:2]] == [[0, 10], [0, 10]]  # over the steps
    assert [ln.get_label() for ln in sens.lines] == ["sensitivity (count)", "on the k relevant bits", "k = 3"]
    assert named(sens) == ("", "Adam step", "Boolean sensitivity")
    assert list(sens.lines[0].get_ydata()) == [0, 2] and list(sens.lines[2].get_ydata()) == [3, 3]
    assert legend_texts(accuracy) == ["train", "test"]  # which line is which, in each panel's legend
    assert legend_texts(sens) == ["sensitivity (count)", "on the k relevant bits", "k = 3"]


def test_the_grokking_figure_draws_each_seed_and_its_phases(tmp_path, drawn):
    """draw_grokking: four panels over epochs, linear to 100 then logarithmic (accuracy, loss on a log scale,
    sensitivity, weight norm), one visible line per seed and quantity, a quantity's seeds in one colour and labelled
    once; each run's memorised (train accuracy 1) and grokked (test accuracy above 0.95) epochs as vertical lines in
    every panel."""
    def hist(s, grok):  # memorised at epoch 100, grokked at `grok`, the weight norm 5 + s
        return [{"epoch": e, "train_acc": float(e >= 100), "test_acc": float(e >= grok), "train_loss": 1 / (e + 1),
                 "test_loss": 2 / (e + 1), "sens": 0.1 * e, "sens_joint": 0.2 * e, "weight_norm": 5.0 + s}
                for e in (0, 100, 1000, 2000, 3000)]
    runs = {}
    for s, grok in [(0, 1000), (1, 3000)]:
        runs[f"transformer/seed{s}"] = {"model": "transformer", "seed": s, "history": hist(s, grok), "final": {}}
    report.draw({"script": "grokking", "runs": runs}, str(tmp_path))
    axes = drawn[0].axes
    assert in_a_row(axes)
    assert [ax.get_title() for ax in axes] == [f"{t} (2 seeds)" for t in ["accuracy", "loss", "sensitivity (train set)",
                                                                         "total weight norm"]]
    assert [ax.get_xlabel() for ax in axes] == ["epoch"] * 4
    assert [(ax.get_xscale(), ax.xaxis.get_transform().linthresh) for ax in axes] == [("symlog", 100)] * 4  # then log
    assert [ax.get_yscale() for ax in axes] == ["linear", "log", "linear", "linear"]
    assert [legend_texts(ax) for ax in axes] == [["train", "test"], ["train", "test"],
                                                 ["token-wise", "joint (a and b)"], ["|w|"]]
    acc = axes[0].lines
    assert [list(ln.get_ydata()) for ln in acc[:4]] == [[0, 1, 1, 1, 1]] * 2 + [[0, 0, 1, 1, 1], [0, 0, 0, 0, 1]]
    assert acc[0].get_color() == acc[1].get_color() != acc[2].get_color() == acc[3].get_color()
    assert all(ln.get_linewidth() > 0 for ax in axes for ln in ax.lines)
    for ax in axes:  # after the curves: seed 0's phases, then seed 1's
        assert [ln.get_xdata()[0] for ln in ax.lines[-4:]] == [100, 1000, 100, 3000]
    assert list(axes[3].lines[1].get_ydata()) == [6.0] * 5  # seed 1's weight norm


def test_a_run_with_nothing_finished_draws_no_figure_and_says_so_with_a_list(tmp_path, drawn):
    """Every script's figures of a run none of whose models has finished: no figure, and an empty list of paths,
    which `report.py A B --run-name m` prints after its merge (`print("wrote", ..., *paths)`)."""
    for script in report.SCRIPTS:
        assert report.draw({"script": script, "args": {}, "runs": {}}, str(tmp_path)) == [], script
    assert drawn == []
