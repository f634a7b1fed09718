"""The estimators' declared options: one declaration, checked by compute, shown by the CLI and the explorer."""

from __future__ import annotations

import inspect

import pytest
import torch

import mpo_viz.advantages as A
from mpo_viz.advantages import registry
from mpo_viz.checks import OptionError
from mpo_viz.data.synthetic import make_batch


@pytest.fixture(scope="module")
def batch():
    b = make_batch(8, seed=2, turns=(1, 3), turn_len=(1, 6), obs_len=(1, 4), group_size=4)
    return b.with_token_fields(entropy=torch.rand(b.mask.shape, generator=torch.Generator().manual_seed(0)))


def _user_estimator():
    """A user's estimator with two declared options and one inferred; registered once per process."""
    name = "test_only_scaled_gae"
    if name not in A.available_estimators():

        @A.register_estimator(
            name,
            needs=("values",),
            inputs=lambda b: ((b.token_rewards, b.values, b.mask), {}),
            options=[
                A.Option("scale", kind="float", low=0.0, high=2.0, label="scale", doc="multiplies the GAE advantages"),
                A.Option("mode", kind="choice", choices=("plain", "negated"), doc="sign of the output"),
            ],
        )
        def scaled_gae(rewards, values, mask, *, scale=1.0, mode="plain", tag_count=3):
            """GAE times a scale."""
            a, g = A.gae(rewards, values, mask)
            s = scale if mode == "plain" else -scale
            return a * s, g

    return name


def test_builtin_options_come_from_the_one_vocabulary():
    for name in A.available_estimators():
        est = registry.get_estimator(name)
        if not est.fn.__module__.startswith("mpo_viz."):
            continue
        sig = inspect.signature(est.fn).parameters
        for o in est.spec:
            assert o.doc and o.label, (name, o.name)  # every built-in option is declared with a doc
            assert o.default == sig[o.name].default  # the default is the signature's
            assert registry._VOCAB[o.name].same_meaning(o)
    # defaults differ per estimator, the meaning does not
    assert A.estimator_options("gae")[1].name == "lam" and A.estimator_options("gae")[1].default == 1.0
    assert [o.default for o in A.estimator_options("mpo") if o.name == "lam"] == [0.95]
    assert A.vocabulary(["mpo", "gae"])["lam"].default == 0.95  # the first taker's default
    assert A.vocabulary(["gae", "mpo"])["lam"].default == 1.0


@pytest.mark.parametrize(
    "name,opts,match",
    [
        ("mpo", {"beta": -0.5}, r"beta: expected a value in \[0, inf\), found -0.5"),
        ("mpo", {"lam": 1.5}, r"lam: expected a value in \[0, 1\], found 1.5"),
        (
            "mpo",
            {"within": "INTRA"},
            r"within: expected one of 'intra', 'local', 'global', 'td', 'baseline', found 'INTRA'",
        ),
        ("mpo", {"gamma": "0.9"}, r"gamma: expected a number, found '0.9'"),
        ("mpo", {"whiten": 1}, r"whiten: expected True or False, found 1"),
        ("vapo", {"alpha": 0.0}, r"alpha: expected a value in \(0, inf\), found 0.0"),
        (
            "gae",
            {"beta": 1.0},
            r"options: estimator 'gae' has no option 'beta'; valid options: gamma, lam, lam_rule, alpha, q, whiten",
        ),
    ],
)
def test_compute_checks_every_option_against_its_declaration(batch, name, opts, match):
    with pytest.raises(OptionError, match=match) as e:
        A.compute(batch, name, **opts)
    assert e.value.option == (next(iter(opts)) if "has no option" not in match else "options")


def test_the_widget_engine_goes_through_the_same_checks(batch):
    from mpo_viz.widgets.engine import AdvantageEngine

    eng = AdvantageEngine(batch, ["mpo", "gae"])
    with pytest.raises(OptionError, match=r"lam: expected a value in \[0, 1\], found 2.0"):
        eng.compute({"lam": 2.0})
    got = eng.compute({"beta": 0.5, "lam": 0.9})
    ref = A.compute(batch, "mpo", beta=0.5, lam=0.9)
    torch.testing.assert_close(got["mpo"][0], ref.advantages, rtol=0, atol=0)
    torch.testing.assert_close(got["gae"][0], A.compute(batch, "gae", lam=0.9).advantages, rtol=0, atol=0)


def test_register_refuses_inconsistent_declarations():
    def f(batch, *, lam=0.5, beta=1.0):
        return batch.mask, batch.mask

    with pytest.raises(ValueError, match=r"option 'lam' \(choice one of a, b\) means something else"):
        A.register_estimator("test_only_bad1", options=[A.Option("lam", kind="choice", choices=("a", "b"))])(f)
    with pytest.raises(ValueError, match=r"declares default 0.7 but .*f has 0.5"):
        A.register_estimator("test_only_bad2", options=[A.Option("lam", 0.7, kind="float", low=0.0, high=1.0)])(f)
    with pytest.raises(ValueError, match=r"declares 'nope', which .*f does not take"):
        A.register_estimator("test_only_bad3", options=[A.Option("nope")])(f)
    with pytest.raises(ValueError, match=r"kind: expected one of"):
        A.Option("x", kind="number")
    assert not [n for n in A.available_estimators() if n.startswith("test_only_bad")]


def test_split_options_refuses_an_option_nobody_takes():
    assert A.split_options(["mpo", "grpo"], {"beta": 0.5, "eps": 0.1, "lam": None}) == {
        "mpo": {"beta": 0.5},
        "grpo": {"eps": 0.1},
    }
    with pytest.raises(OptionError, match=r"beta: none of the estimators gae, grpo takes this option \(mpo does\)"):
        A.split_options(["gae", "grpo"], {"beta": 0.5})
    with pytest.raises(OptionError, match=r"estimators: unknown estimator 'MPO' \(names are lower case: 'mpo'\)"):
        A.parse_names("gae, MPO")
    assert A.parse_names(" mpo,gae ,") == ("mpo", "gae")


def test_user_estimator_with_options_runs_and_is_checked(batch):
    name = _user_estimator()
    assert [(o.name, o.kind, o.default) for o in A.estimator_options(name)] == [
        ("scale", "float", 1.0),
        ("mode", "choice", "plain"),
        ("tag_count", "int", 3),
    ]
    res = A.compute(batch, name, scale=0.5, mode="negated")
    torch.testing.assert_close(res.advantages, -0.5 * A.compute(batch, "gae").advantages)
    with pytest.raises(OptionError, match=r"scale: expected a value in \[0, 2\], found 3"):
        A.compute(batch, name, scale=3)
    with pytest.raises(OptionError, match=r"tag_count: expected an integer, found 2.5"):
        A.compute(batch, name, tag_count=2.5)


def test_user_estimator_shows_in_cli_help_and_runs_from_flags(batch, tmp_path, capsys):
    import mpo_viz as mv
    from mpo_viz.cli import main

    name = _user_estimator()
    with pytest.raises(SystemExit):
        main(["advantages", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert name in out
    assert f"--scale SCALE multiplies the GAE advantages [{name}; default 1.0] in [0, 2]" in out
    assert "--mode {plain,negated}" in out and "--tag-count TAG_COUNT" in out
    path = tmp_path / "b.parquet"
    mv.save(batch, path)
    out_path = tmp_path / "o.parquet"
    assert (
        main(["advantages", str(path), "-e", f"gae,{name}", "--scale", "0.25", "-o", str(out_path), "--no-progress"])
        == 0
    )
    got = mv.load(out_path)
    m = batch.mask.numpy() != 0
    ref = 0.25 * A.compute(batch, "gae").advantages.numpy()[m]
    assert abs(got.padded(f"adv_{name}").numpy()[m] - ref).max() < 1e-6
    assert (
        main(["advantages", str(path), "-e", name, "--scale", "5", "-o", str(tmp_path / "x.parquet"), "--no-progress"])
        == 1
    )
    assert "error: --scale: expected a value in [0, 2], found 5.0" in capsys.readouterr().err


def test_user_estimator_shows_in_the_explorer(batch):
    import ipywidgets as W

    from mpo_viz.widgets import TrajectoryExplorer

    name = _user_estimator()
    ex = TrajectoryExplorer(batch, estimators=["mpo", name])
    c = ex.params.controls
    assert isinstance(c["scale"], W.FloatSlider) and (c["scale"].min, c["scale"].max, c["scale"].value) == (
        0.0,
        2.0,
        1.0,
    )
    assert isinstance(c["mode"], W.Dropdown) and c["mode"].options == ("plain", "negated")
    assert isinstance(c["tag_count"], W.IntText)
    assert isinstance(c["beta"], W.FloatSlider) and c["beta"].max == 3.0  # β's slider span
    assert isinstance(c["whiten"], W.Checkbox)
    ex.params.set(scale=0.5)
    torch.testing.assert_close(ex.results[name][0], 0.5 * A.compute(batch, "gae").advantages)


def test_the_functions_own_checks_agree_with_the_declarations(batch):
    # the tensor functions check their arguments themselves (they are called without the registry);
    # their bounds and choices must be the declared ones: a value just outside is refused by both,
    # a value on a closed bound is accepted by both
    checked = 0
    for name in A.available_estimators():
        est = registry.get_estimator(name)
        if not est.fn.__module__.startswith("mpo_viz."):
            continue
        args, kwargs = est.inputs(batch)
        for o in est.spec:
            bad, good = [], []
            if o.kind == "float":
                if o.low is not None:
                    bad.append(o.low - 1e-3)
                    (bad if o.low_open else good).append(o.low)
                if o.high is not None:
                    bad.append(o.high + 1e-3)
                    (bad if o.high_open else good).append(o.high)
            elif o.kind == "choice":
                bad.append("nope")
                good += list(o.choices)
            for v in bad:
                with pytest.raises(ValueError, match=o.name):
                    est.fn(*args, **kwargs, **{o.name: v})
                with pytest.raises(OptionError):
                    registry.bind(batch, name).resolve(**{o.name: v})
                checked += 1
            for v in good:
                est.fn(*args, **kwargs, **{o.name: v})
                registry.bind(batch, name).resolve(**{o.name: v})
    assert checked > 25
