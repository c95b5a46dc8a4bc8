"""GPT model, DeepNorm init, tiny Shakespeare data, diagnostics, and end-to-end runs and sweeps."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO, TINY

from normlab.callbacks.grad_norms import GradAtInit, block_grad_norms
from normlab.data.shakespeare import ShakespeareDataModule
from normlab.errors import ConfigError, DataError
from normlab.models.transformer import GPT
from normlab.norms import norm_partial
from normlab.norms.residual import available_placements, deepnorm_constants
from normlab.sweep.callbacks import EXIT_JOBS_FAILED
from normlab.tasks.language_model import LanguageModelTask

LAYERNORM = norm_partial("layernorm", eps=1e-5, elementwise_affine=True, bias=True)
DATA_ROOT = Path(os.environ["NORMLAB_DATA"])


def gpt(placement: str, seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    return GPT(65, {"name": placement, "arch": "decoder"}, LAYERNORM, **kw)


def text_batch(ctx: int = 64, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    data = ShakespeareDataModule(str(DATA_ROOT), batch_size=batch, ctx=ctx, val_batches=1)
    data.setup()
    x, y = next(iter(data.train_dataloader()))
    return x, y


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("placement", available_placements())
def test_forward_shape_and_causal(placement):
    model = gpt(placement).eval()
    idx = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(idx)
    assert logits.shape == (2, 16, 65)
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 65
    after = model(changed)
    torch.testing.assert_close(after[:, :10], logits[:, :10])  # the past never sees the future
    assert not torch.allclose(after[:, 10:], logits[:, 10:])


def test_deepnorm_beta_scales_exactly_v_out_and_mlp():
    depth = 6
    post, deep = gpt("post", depth=depth), gpt("deepnorm", depth=depth)
    _, beta = deepnorm_constants("decoder", M=depth)
    scaled = ("v_proj.weight", "out_proj.weight", "fc1.weight", "fc2.weight")
    deep_params = dict(deep.named_parameters())
    seen = set()
    for name, p in post.named_parameters():
        factor = beta if name.endswith(scaled) else 1.0
        torch.testing.assert_close(deep_params[name], factor * p, rtol=1e-5, atol=1e-7)
        if factor != 1.0:
            seen.add(name.rsplit(".", 2)[-2])
    assert seen == {"v_proj", "out_proj", "fc1", "fc2"}  # q_proj, k_proj: gain 1 in both
    for block in deep.blocks:  # the placement holds DeepNet's decoder constants for M = depth
        for residual in (block.attn, block.mlp):
            assert residual.alpha == pytest.approx((2 * depth) ** 0.25)
            assert residual.beta == pytest.approx((8 * depth) ** -0.25)


def test_explicit_shape_and_errors():
    model = gpt("pre", depth=2, d_model=32, n_heads=2, ctx=16)
    assert (len(model.blocks), model.d_model, model.ctx) == (2, 32, 16)
    assert model.lm_head.weight is model.tok_emb.weight
    # the model speaks of its own arguments (normlab.config names the config keys)
    with pytest.raises(ValueError, match="^n_heads=3 does not divide d_model=64$"):
        gpt("pre", n_heads=3)
    with pytest.raises(ValueError, match=r"^depth must be a positive integer, got None$"):
        gpt("pre", depth=None)  # no null: the shape is always given
    with pytest.raises(ValueError, match=r"^dropout must be a number in \[0, 1\]"):
        gpt("pre", dropout=None)
    with pytest.raises(ConfigError, match="encoder_decoder"):
        GPT(65, {"name": "deepnorm", "arch": "encoder_decoder"}, LAYERNORM)


def test_grad_norm_at_init_grows_with_depth_for_post_ln_only():
    # Xiong et al. 2020, Fig. 3: at initialization Post-LN's gradient norm grows towards the last
    # layer, Pre-LN's does not. Deterministic seed; margin: post last/first > 1.2, pre < 0.8
    # (measured 1.51 and 0.33 for this seed and batch).
    x, y = text_batch()
    ratios = {}
    for placement in ("post", "pre"):
        model = gpt(placement, depth=6)
        F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        norms = block_grad_norms(model.blocks)
        assert len(norms) == 6
        ratios[placement] = norms[-1] / norms[0]
    assert ratios["post"] > 1.2, ratios
    assert ratios["pre"] < 0.8, ratios


@pytest.mark.parametrize("placement", ["post", "pre"])
def test_grad_at_init_is_the_mean_over_batches_of_each_blocks_w2_gradient_norm(placement):
    task = LanguageModelTask(gpt(placement, depth=3), {"optimizer": None})
    data = ShakespeareDataModule(str(DATA_ROOT), batch_size=4, ctx=16, val_batches=1, seed=7)
    data.setup()
    by_hand = torch.zeros(3, dtype=torch.float64)
    for x, y in list(data.train_dataloader())[:3]:  # the first 3 batches, one at a time
        task.zero_grad()
        F.cross_entropy(task.net(x).flatten(0, 1), y.flatten()).backward()
        by_hand += torch.tensor([float(b.mlp.sublayer.fc2.weight.grad.norm())
                                 for b in task.net.blocks])  # fmt: skip
    task.zero_grad(set_to_none=True)
    rng = torch.random.get_rng_state()
    task.eval()
    norms = GradAtInit(batches=3).norms(task, data.train_dataloader())
    assert norms == pytest.approx((by_hand / 3).tolist(), rel=1e-5)
    assert all(p.grad is None for p in task.parameters())  # no gradient left behind
    assert torch.equal(torch.random.get_rng_state(), rng) and not task.training  # mode restored
    with pytest.raises(ValueError, match="has 3"):
        GradAtInit(batches=4).norms(task, list(data.train_dataloader())[:3])
    with pytest.raises(ValueError, match="> 0"):
        GradAtInit(batches=0)


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def test_batches_are_shifted_windows_and_val_is_fixed():
    data = ShakespeareDataModule(str(DATA_ROOT), batch_size=4, ctx=8, val_batches=2)
    data.setup()
    x, y = next(iter(data.train_dataloader()))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert data.decode(data.encode("To be")) == "To be"
    first = [b[0] for b in data.val_dataloader()]
    second = [b[0] for b in data.val_dataloader()]
    assert len(first) == 2 and all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_missing_file_offline_names_the_path(tmp_path):
    data = ShakespeareDataModule(str(tmp_path), batch_size=4, ctx=8, download=False)
    data.prepare_data()
    with pytest.raises(DataError, match=str(tmp_path / "tinyshakespeare" / "input.txt")):
        data.setup()


def test_download_is_checked_and_atomic(tmp_path):
    good = (DATA_ROOT / "tinyshakespeare" / "input.txt").resolve().as_uri()
    data = ShakespeareDataModule(str(tmp_path / "ok"), batch_size=4, ctx=8, url=good)
    data.prepare_data()
    data.setup()
    assert len(data.chars) == 65
    wrong = tmp_path / "wrong.txt"
    wrong.write_text("not shakespeare")
    bad = ShakespeareDataModule(str(tmp_path / "bad"), 4, ctx=8, url=wrong.as_uri())
    with pytest.raises(DataError, match="sha256"):
        bad.prepare_data()
    assert not any((tmp_path / "bad" / "tinyshakespeare").iterdir())  # nothing left behind
    offline = ShakespeareDataModule(str(tmp_path / "off"), 4, ctx=8, url=(tmp_path / "no").as_uri())
    with pytest.raises(DataError, match="put input.txt there"):
        offline.prepare_data()


def test_corrupted_file_and_vocab_mismatch(tmp_path):
    path = tmp_path / "tinyshakespeare" / "input.txt"
    path.parent.mkdir()
    path.write_text("not shakespeare")
    with pytest.raises(DataError, match="sha256"):
        ShakespeareDataModule(str(tmp_path), batch_size=4, ctx=8).setup()
    data = ShakespeareDataModule(str(DATA_ROOT), batch_size=4, ctx=8, vocab_size=64)
    with pytest.raises(ConfigError, match="data.vocab_size=65"):
        data.setup()


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------

LM_TINY = [*TINY, "model=transformer", "batch=8", "trainer.limit_train_batches=3"]


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    (path,) = run_dir.rglob("metrics.csv")
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("placement", available_placements())
def test_train_each_placement(compose, tmp_path, placement):
    from normlab.run import train

    cfg = compose([*LM_TINY, f"placement={placement}"], tmp_path)
    assert cfg.data._target_.endswith("ShakespeareDataModule")
    assert (
        cfg.norm._target_ == "normlab.norms.LayerNorm"
        and cfg.optim.optimizer._target_ == "torch.optim.AdamW"
    )
    result, _ = train(cfg)
    assert result["status"] == "ok"
    assert result["metrics"]["val/bpc"] == pytest.approx(
        result["metrics"]["val/loss"] / 0.6931, 1e-3
    )
    rows = read_metrics(tmp_path)
    series = sorted(k for k in rows[0] if k.startswith("grad_norm/"))
    assert series == [f"grad_norm/block_{i:02d}" for i in range(4)]  # one series per layer
    init = [r for r in rows if r["step"] == "0" and r["grad_norm/block_00"]]
    assert len(init) == 1  # the gradients at initialization
    assert any(r["update_norm"] for r in rows)
    assert (tmp_path / "samples_text.txt").read_text().startswith("--- step")


def test_overrides_reach_the_model(compose, tmp_path):
    from hydra.utils import instantiate

    from normlab.run import train

    overrides = ["placement=deepnorm", "norm=rmsnorm", "model.net.depth=6"]
    overrides += ["optim.warmup_steps=0", "trainer.gradient_clip_val=1.0"]
    cfg = compose([*LM_TINY, *overrides], tmp_path)
    task = instantiate(cfg.model)
    assert len(task.net.blocks) == 6 and cfg.optim.warmup_steps == 0
    assert type(task.net.blocks[0].attn.norm).__name__ == "RMSNorm"
    assert train(cfg)[0]["status"] == "ok"


def test_ln_placement_init_logs_w2_gradients_at_init_of_its_seed_without_a_step(compose, tmp_path):
    import lightning.pytorch as pl
    from hydra.utils import instantiate

    from normlab.run import train

    overrides = ["experiment=ln_placement_init", "placement=post", "model.net.depth=3", "seed=3"]
    overrides += ["batch=4", "callbacks.grad_at_init.batches=2"]
    cfg = compose(overrides, tmp_path)
    assert train(cfg)[0]["status"] == "ok"
    (row,) = read_metrics(tmp_path)  # one row: step 0, nothing trained, nothing validated
    assert row["step"] == "0" and set(row) == {"step"} | {
        f"grad_init/block_{i:02d}/w2" for i in range(3)
    }
    pl.seed_everything(3)  # the seed sets the init and (data.seed) the batches
    task = instantiate(cfg.model)
    data = instantiate(cfg.data)
    data.setup()
    assert data.seed == 3 and data.ctx == task.net.ctx  # data.ctx: ${model.net.ctx}
    expected = GradAtInit(batches=2).norms(task, data.train_dataloader())
    logged = [float(row[f"grad_init/block_{i:02d}/w2"]) for i in range(3)]
    assert logged == pytest.approx(expected, rel=1e-5)


def test_multirun_records_diverged_job(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "train.py",
        "-m",
        *LM_TINY,
        "placement=post,pre",
        "optim.optimizer.lr=1e-3,1e4",  # 1e4: AdamW's first step blows the weights up
        "optim.warmup_steps=0",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == EXIT_JOBS_FAILED, proc.stderr[-3000:]  # after all four jobs ran
    with open(sweep / "summary.csv", newline="") as f:
        rows = {r["overrides"]: r["status"] for r in csv.DictReader(f)}
    assert len(rows) == 4, rows
    for overrides, status in rows.items():
        assert status == (
            "diverged" if "lr=10000" in overrides or "lr=1e4" in overrides else "ok"
        ), rows


@pytest.mark.parametrize("seed", [0, 7])
def test_the_training_windows_follow_the_runs_seed(compose, tmp_path, seed):
    """Every language-model run draws its windows from its own seed (no experiment has to say so),
    so seeds differ in data order as well as in init."""
    cfg = compose(["model=transformer", f"seed={seed}"], tmp_path)
    assert cfg.data.seed == seed


def test_norm_at_gives_each_position_its_own_keywords():
    """The DyT paper's LLaMA recipe: alpha0 of the attention-input, FFN-input and final norms
    set apart; the other keywords (no bias) shared."""
    dyt = norm_partial("dyt", alpha0=0.5, bias=False)
    at = {"attn": {"alpha0": 0.8}, "mlp": {"alpha0": 0.2}, "final": {"alpha0": 0.1}}
    model = GPT(65, {"name": "pre"}, dyt, depth=2, d_model=32, n_heads=2, ctx=16, norm_at=at)
    for block in model.blocks:
        assert block.attn.norm.alpha.item() == pytest.approx(0.8)
        assert block.mlp.norm.alpha.item() == pytest.approx(0.2)
        assert block.attn.norm.bias is None and block.mlp.norm.bias is None
    assert model.final_norm.alpha.item() == pytest.approx(0.1)
    plain = GPT(65, {"name": "pre"}, dyt, depth=2, d_model=32, n_heads=2, ctx=16)
    assert {m.alpha.item() for m in plain.modules() if hasattr(m, "alpha")} == {0.5}
    with pytest.raises(ValueError, match="norm_at has no position ffn"):
        GPT(65, {"name": "pre"}, dyt, depth=2, d_model=32, n_heads=2, ctx=16,
            norm_at={"ffn": {"alpha0": 1.0}})  # fmt: skip
    with pytest.raises(Exception, match="unexpected keyword argument 'alpha0'"):
        GPT(65, {"name": "pre"}, torch.nn.LayerNorm, depth=2, d_model=32, n_heads=2, ctx=16,
            norm_at=at)  # fmt: skip
