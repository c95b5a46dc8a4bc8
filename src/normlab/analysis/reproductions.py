"""The papers' comparison plots: one entry per NAME of `python scripts/reproduce.py NAME`.

Each entry names its experiment config (the sweep grid lives there), a full budget (what the
README reports) and a --quick budget (every figure in about a minute, used by tests).
"""

from __future__ import annotations

from normlab.analysis import (
    bn_lenet,
    deepnorm_depth,
    dit_conditioning,
    gn_batch_size,
    ln_placement,
    rmsnorm_speed,
)
from normlab.analysis.sweep import Budget, Reproduction, ensure_fid_lenet

QUICK_EPOCHS = (
    "trainer.max_epochs=2",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=2",
)
# The language model has no test split: test=false on the command line (an experiment's own
# top-level keys lose to train.yaml's).
NO_TEST = ("test=false",)
# A quick Transformer job: 2 epochs of 10 steps on 16 windows, one validation batch.
QUICK_LM = (
    *NO_TEST,
    "batch=16",
    "trainer.max_epochs=2",
    "data.train_batches_per_epoch=10",
    "data.val_batches=1",
    "trainer.log_every_n_steps=5",
)

REPRODUCTIONS: dict[str, Reproduction] = {
    r.name: r
    for r in [
        Reproduction(
            name="bn_lenet",
            title="BatchNorm trains faster and keeps a sigmoid's input stable (BN paper Fig. 1)",
            experiment="bn_lenet",
            full=Budget((), "4 jobs x 10 epochs of 100 steps at batch 64 (64k images each)"),
            quick=Budget(
                (
                    "trainer.limit_train_batches=15",
                    "trainer.log_every_n_steps=3",
                    "callbacks.norm_stats.every_n_steps=3",
                    *QUICK_EPOCHS,
                ),
                "4 jobs x 2 epochs of 15 steps at batch 64",
            ),
            analyze=bn_lenet.analyze,
        ),
        Reproduction(
            name="gn_batch_size",
            title="BN's error grows as the batch shrinks, GN's stays flat (GN paper Fig. 1)",
            experiment="gn_batch_size",
            full=Budget(
                (),
                "20 jobs (4 norms x batch 32/16/8/4/2), 4 epochs of 5.5k images each (22k images, "
                "690 steps at batch 32 to 11k at batch 2), lr 0.1 x batch/32",
            ),
            quick=Budget(
                (
                    "norm=batchnorm,groupnorm",
                    "batch=32,2",
                    "trainer.max_epochs=1",
                    "trainer.limit_train_batches=0.02",
                    "trainer.limit_val_batches=1",
                    "trainer.limit_test_batches=2",
                ),
                "4 jobs (BN, GN x batch 32, 2), 1 epoch of 1.1k images",
            ),
            analyze=gn_batch_size.analyze,
        ),
        Reproduction(
            name="ln_placement",
            title="Post-LN needs warmup, Pre-LN does not (Xiong et al. 2020)",
            experiment="ln_placement",
            full=Budget(
                # at lr 3e-3 Post-LN trained neither with nor without warmup (val loss stuck at
                # the unigram level): at 1e-3 warmup is what decides it, the paper's regime
                (*NO_TEST, "batch=32", "optim.optimizer.lr=1e-3"),
                "18 jobs (post, pre, deepnorm x warmup 0 / 100 steps x seeds 42, 43, 44), 600 "
                "steps of 32 windows of 64 characters, depth 6, d_model 64, AdamW lr 1e-3",
            ),
            quick=Budget(
                (
                    "placement=post,pre",
                    "seed=42",
                    *QUICK_LM,
                    "callbacks.grad_norms.every_n_steps=5",
                ),
                "4 jobs (post, pre x warmup 0 / 100, one seed), 20 steps of 16 windows",
            ),
            analyze=ln_placement.analyze,
            requires=("model/transformer.yaml",),
        ),
        Reproduction(
            name="deepnorm_depth",
            title="Post-LN's model update explodes with depth, DeepNorm's stays bounded (DeepNet)",
            experiment="deepnorm_depth",
            full=Budget(
                (*NO_TEST, "batch=16"),
                "9 jobs (post, pre, deepnorm x depth 6, 18, 50), 300 steps of 16 windows, "
                "d_model 64; update_norm every step",
            ),
            quick=Budget(
                ("model.net.depth=2,6", *QUICK_LM, "callbacks.update_norm.steps=20"),
                "6 jobs (post, pre, deepnorm x depth 2, 6), 20 steps of 16 windows",
            ),
            analyze=deepnorm_depth.analyze,
            requires=("model/transformer.yaml",),
        ),
        Reproduction(
            name="rmsnorm_speed",
            title="RMSNorm is faster than LayerNorm at comparable quality (Zhang & Sennrich 2019)",
            experiment="rmsnorm_speed",
            full=Budget(
                NO_TEST,
                "3 jobs (layernorm, rmsnorm, prmsnorm) one at a time, 300 steps of 32 windows, "
                "Pre-LN, depth 4, d_model 128",
            ),
            quick=Budget(QUICK_LM, "3 jobs one at a time, 20 steps of 16 windows"),
            analyze=rmsnorm_speed.analyze,
            requires=("model/transformer.yaml",),
            max_jobs=1,  # timings: one job at a time, so the jobs do not slow each other
        ),
        Reproduction(
            name="dit_conditioning",
            title="adaLN-Zero beats adaLN, cross-attention and in-context conditioning (DiT)",
            experiment="dit_conditioning",
            full=Budget(
                ("batch=64",),
                "4 jobs (adaln_zero, adaln, cross_attn, in_context), 900 steps of 64 images, "
                "val/fid_lenet of 1000 samples after 450 and 900 steps",
            ),
            quick=Budget(
                (
                    "batch=16",
                    "trainer.max_epochs=1",
                    "trainer.limit_train_batches=5",
                    "trainer.limit_val_batches=1",
                    "trainer.limit_test_batches=1",
                    "model.sample_steps=5",
                    "callbacks.samples.per_class=1",
                    "callbacks.fid.every_n_epochs=1",
                    "callbacks.fid.num_samples=100",
                    "callbacks.fid.steps=5",
                    "callbacks.fid.batch_size=100",
                ),
                "4 jobs, 5 steps of 16 images, val/fid_lenet of 100 samples",
            ),
            analyze=dit_conditioning.analyze,
            requires=("model/dit.yaml",),
            prepare=ensure_fid_lenet,
        ),
    ]
}
