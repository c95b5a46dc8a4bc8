"""The papers' comparison plots: one entry per NAME of `python scripts/reproduce.py NAME`.

Each entry names its experiment config (the sweep grid lives there), a full budget (what the
README reports) and a --quick budget (every figure in about a minute, used by tests).
"""

from __future__ import annotations

from normlab.analysis import (
    bn_lenet,
    deepnorm_depth,
    dit_conditioning,
    dyt_vs_ln,
    gn_batch_size,
    ln_placement,
    ln_rnn,
    rmsnorm_speed,
)
from normlab.analysis.sweep import Budget, Grid, Reproduction, ensure_fid_lenet

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

# A quick DiT job: 5 steps of 16 images, val/fid_lenet of 100 samples of 5 DDIM steps.
QUICK_DIT = (
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
)

# BatchNorm's statistics per virtual device of per_device images (Ghost BN)
GHOST = "norm.ghost_batch=${per_device}"
# Precise BN (Wu & Johnson 2021): population statistics over 200 training batches before test
PRECISE = "callbacks.precise_bn.enabled=true"

REPRODUCTIONS: dict[str, Reproduction] = {
    r.name: r
    for r in [
        Reproduction(
            name="bn_lenet",
            title="BatchNorm trains faster and keeps a sigmoid's input stable (BN paper Fig. 1)",
            grids=(Grid("lenet", "bn_lenet"), Grid("mlp", "bn_mlp")),
            full=Budget(
                (),
                "2 networks (LeNet, the BN paper's 3x100 MLP; sigmoid) x BN / none, per seed: "
                "LeNet 2,700 and MLP 4,500 SGD steps of 60 images, held-out accuracy every 20 "
                "steps on 2,000 images; run with --seeds 5 (3 left the speedup undecided)",
            ),
            quick=Budget(
                (
                    "trainer.max_epochs=2",
                    "trainer.limit_train_batches=40",
                    "trainer.limit_test_batches=2",
                ),
                "2 networks x BN / none, per seed: 80 steps",
            ),
            arm=bn_lenet.arm,
            extract=bn_lenet.extract,
            render=bn_lenet.render,
        ),
        Reproduction(
            name="gn_batch_size",
            title="BN's error grows as the per-device batch shrinks, GN's stays flat "
            "(GN paper Fig. 1)",
            grids=(
                Grid("bn", "gn_batch_size", ("norm=batchnorm", GHOST)),
                Grid("gn", "gn_batch_size", ("norm=groupnorm", "norm.num_groups=4")),
                Grid("ln", "gn_batch_size", ("norm=layernorm",)),
                Grid("in", "gn_batch_size", ("norm=instancenorm",)),
                # BN's population statistics recomputed with the trained weights (precise BN)
                Grid("bn_precise", "gn_batch_size", ("norm=batchnorm", GHOST, PRECISE)),
                # BN's statistics alone: the SGD batch fixed at 8 x 32; b=32 is the bn grid's job
                Grid(
                    "bn_fixed",
                    "gn_batch_size",
                    ("norm=batchnorm", GHOST, "batch=256", "per_device=16,8,4,2"),
                    quick=("per_device=2",),
                ),
            ),
            full=Budget(
                (),
                "4 norms x 5 per-device batches (32..2, 8 virtual devices, lr 0.2 x 8b/256) "
                "+ BN at a fixed SGD batch of 256 x 4 batches, per seed: 24 jobs of 2 epochs "
                "(110k images) each",
            ),
            quick=Budget(
                (
                    "per_device=32,2",
                    "trainer.max_epochs=1",
                    "trainer.limit_train_batches=0.02",
                    "trainer.limit_val_batches=1",
                    "trainer.limit_test_batches=2",
                    "callbacks.precise_bn.num_batches=4",  # the precise arm's statistics
                ),
                "4 norms x per-device 32, 2 + BN fixed at 2, per seed: 9 jobs of 1.1k images",
            ),
            arm=gn_batch_size.arm,
            extract=gn_batch_size.extract,
            render=gn_batch_size.render,
        ),
        Reproduction(
            name="ln_placement",
            title="Post-LN's gradients at init grow with the layer index and it needs warmup; "
            "Pre-LN's do not and it trains without (Xiong et al. 2020)",
            grids=(
                Grid(
                    "init",
                    "ln_placement_init",
                    seeds=10,  # the slopes' CIs: 10 seeds whatever --seeds says
                    quick=("callbacks.grad_at_init.batches=4",),
                ),
                Grid(
                    "warmup",
                    "ln_placement",
                    quick=(
                        "optim.optimizer.lr=1e-3,3e-3",
                        "optim.warmup_steps=0,10",
                        "trainer.val_check_interval=5",
                    ),
                ),
            ),
            full=Budget(
                (),
                "init: Post-LN, Pre-LN x depth 6, 12 x 10 seeds, ||dL/dW2|| per layer at init "
                "averaged over 32 batches of 32 windows (no step); warmup: Post-LN, Pre-LN x lr "
                "5e-4, 1e-3, 2e-3, 3e-3 x warmup 0 / 100 steps x 3 seeds, 600 AdamW steps "
                "(cosine) of 32 windows of 64 characters, depth 6, d_model 64: 40 + 48 jobs",
            ),
            quick=Budget(
                QUICK_LM,
                "init: 4 arms x 2 seeds over 4 batches of 16 windows; warmup: Post-LN, Pre-LN x "
                "lr 1e-3, 3e-3 x warmup 0 / 10 steps x 2 seeds, 20 steps of 16 windows: 8 + 16 "
                "jobs",
            ),
            arm=ln_placement.arm,
            extract=ln_placement.extract,
            render=ln_placement.render,
        ),
        Reproduction(
            name="ln_rnn",
            title="LayerNorm speeds up the training of an RNN (Ba, Kiros & Hinton 2016)",
            grids=(Grid("", "ln_rnn", quick=("trainer.val_check_interval=5",)),),
            full=Budget(
                (),
                "plain LSTM, LN-LSTM x 3 seeds: 2 layers of 256, 1,200 AdamW steps (lr 1e-3, "
                "100 warmup, cosine) of 32 windows of 64 characters, val loss every 50 steps: "
                "6 jobs",
            ),
            quick=Budget(
                (*QUICK_LM, "model.net.hidden_size=32", "model.net.ctx=16"),
                "2 norms x 2 seeds, 20 steps of 16 windows of 16 characters, hidden 32: 4 jobs",
            ),
            arm=ln_rnn.arm,
            extract=ln_rnn.extract,
            render=ln_rnn.render,
        ),
        Reproduction(
            name="deepnorm_depth",
            title="Post-LN's early model update grows with depth, DeepNorm's stays bounded, and "
            "DeepNorm trains the deep model better (DeepNet)",
            grids=(
                Grid(
                    "update",
                    "deepnorm_update",
                    quick=(
                        "model.net.depth=2,4",
                        "trainer.max_steps=12",
                        "optim.warmup_steps=0,5",
                        "callbacks.update_norm.steps=12",
                    ),
                ),
                Grid(
                    "loss",
                    "deepnorm_depth",
                    quick=("model.net.depth=2,4", "trainer.val_check_interval=5"),
                ),
            ),
            full=Budget(
                (),
                "update: Post-LN, DeepNorm x depth 6, 18, 50 x warmup 0 / 100 steps x 3 seeds, "
                "||F(x,θ_t) - F(x,θ_0)|| after each of the first 50 AdamW steps; loss: Post-LN, "
                "DeepNorm x depth 6, 50 x 3 seeds, 300 steps; 16 windows of 64 characters a "
                "step, d_model 64: 36 + 12 jobs",
            ),
            quick=Budget(
                QUICK_LM,
                "update: 2 placements x depth 2, 4 x warmup 0 / 5 x 2 seeds, 12 steps; loss: 2 "
                "placements x depth 2, 4 x 2 seeds, 20 steps of 16 windows: 16 + 8 jobs",
            ),
            arm=deepnorm_depth.arm,
            extract=deepnorm_depth.extract,
            render=deepnorm_depth.render,
        ),
        Reproduction(
            name="rmsnorm_speed",
            title="RMSNorm is faster than LayerNorm at comparable quality (Zhang & Sennrich 2019)",
            grids=(
                Grid(
                    "speed",
                    "rmsnorm_speed",
                    quick=(
                        "trainer.max_steps=25",
                        "trainer.max_epochs=3",  # QUICK_LM's 2 epochs of 10 would stop it at 20
                        "callbacks.paired_step_time.warmup=5",
                    ),
                ),
                Grid("quality", "rmsnorm_quality", quick=("trainer.val_check_interval=5",)),
            ),
            full=Budget(
                (),
                "speed: LayerNorm (control), RMSNorm, pRMSNorm x 1, 2 threads x 3 seeds as "
                "repeats, each job 10 warmup + 300 timed pairs (the norm's twin and LayerNorm's "
                "twin, one step each after each of the run's 310 steps); quality: LayerNorm, "
                "RMSNorm, pRMSNorm x 3 seeds, 600 AdamW steps, val loss every 50; Pre-LN, depth "
                "4, d_model 128, 32 windows of 64 characters a step: 18 + 9 jobs, one at a time",
            ),
            quick=Budget(
                # one thread: jobs at 2 threads crawl on a machine busy with other work
                (*QUICK_LM, "model.net.d_model=32", "num_threads=1"),
                "speed: 3 norms x 2 seeds, 5 warmup + 20 timed pairs; quality: 3 norms x 2 "
                "seeds, 20 steps; d_model 32, 16 windows a step, 1 thread: 6 + 6 jobs",
            ),
            arm=rmsnorm_speed.arm,
            extract=rmsnorm_speed.extract,
            render=rmsnorm_speed.render,
            max_jobs=1,  # timings: one job at a time, so the jobs do not slow each other
        ),
        Reproduction(
            name="dit_conditioning",
            title="adaLN-Zero beats adaLN, cross-attention and in-context conditioning (DiT)",
            grids=(Grid("conditioning", "dit_conditioning"),),
            full=Budget(
                (),
                "adaLN-Zero, adaLN, cross-attention, in-context x 3 seeds on the tiny DiT (4 "
                "blocks). Each job 2,400 AdamW steps of 64 images (lr 2e-3, 100 warmup, cosine), "
                "then val/fid_lenet of 5,000 samples without guidance (25 DDIM steps) from the EMA "
                "weights, and of a second set of 5,000 (other starting noise) from each arm's "
                "seed-0 checkpoint: 12 jobs",
            ),
            quick=Budget(
                QUICK_DIT,
                "4 conditionings x 2 seeds, 5 steps of 16 images, val/fid_lenet of 100 "
                "samples (5 DDIM steps), resampled once per arm",
            ),
            arm=dit_conditioning.arm,
            extract=dit_conditioning.extract,
            render=dit_conditioning.render,
            finish=dit_conditioning.resample,
            prepare=ensure_fid_lenet,
        ),
        Reproduction(
            name="dit_conditioning_deep",
            title="adaLN-Zero beats adaLN in a DiT of twice the depth (DiT Sec. 3.2)",
            grids=(Grid("conditioning", "dit_conditioning_deep"),),
            full=Budget(
                (),
                "adaLN-Zero, adaLN x 3 seeds on the tiny DiT at 8 blocks instead of 4, at "
                "dit_conditioning's recipe: 2,400 AdamW steps of 64 images, then val/fid_lenet "
                "of 5,000 samples without guidance (25 DDIM steps) from the EMA weights, and of "
                "a second set from each arm's seed-0 checkpoint: 6 jobs",
            ),
            quick=Budget(
                QUICK_DIT,
                "adaLN-Zero, adaLN x 2 seeds, 5 steps of 16 images, val/fid_lenet of 100 "
                "samples (5 DDIM steps), resampled once per arm",
            ),
            arm=dit_conditioning.arm,
            extract=dit_conditioning.extract,
            render=dit_conditioning.render_deep,
            finish=dit_conditioning.resample,
            prepare=ensure_fid_lenet,
        ),
        Reproduction(
            name="dyt_vs_ln",
            title="DyT matches LayerNorm in a GPT and a DiT, and LayerNorm's input-output map is "
            "tanh-like in deeper layers (Zhu et al. 2025)",
            grids=(
                Grid("gpt", "dyt_vs_ln_gpt", quick=(*QUICK_LM, "trainer.val_check_interval=5")),
                Grid(
                    "dyt",
                    "dyt_vs_ln_gpt",
                    ("norm=dyt", "model.net.embed_scale=50", "norm.alpha0=0.25,0.5,1.0,2.0"),
                    quick=(*QUICK_LM, "trainer.val_check_interval=5", "norm.alpha0=0.5"),
                ),
                # 800 steps (4 epochs of 200), not the experiment's 1,200: a session's budget
                Grid("dit", "dyt_vs_ln_dit", ("trainer.limit_train_batches=200",), QUICK_DIT),
            ),
            full=Budget(
                (),
                "gpt: LayerNorm, DyT (alpha0 0.5), RMSNorm x 3 seeds, Pre-LN GPT of depth 4, "
                "d_model 128, 600 AdamW steps of 32 windows of 64 characters, val loss every "
                "50; dyt: DyT with the embeddings times a learnable scalar (init 50) at alpha0 "
                "0.25, 0.5, 1, 2 in the same GPT x 3 seeds; dit: LayerNorm, DyT, RMSNorm x 3 "
                "seeds on the tiny adaLN-Zero DiT, 800 AdamW steps of 64 images, then "
                "val/fid_lenet of 2,000 samples without guidance (25 DDIM steps): 9 + 12 + 9 "
                "jobs",
            ),
            quick=Budget(
                (),
                "gpt: 3 norms x 2 seeds, 20 steps of 16 windows; dyt: alpha0 0.5 x 2 seeds; "
                "dit: 3 norms x 2 seeds, 5 steps of 16 images, val/fid_lenet of 100 samples: "
                "6 + 2 + 6 jobs",
            ),
            arm=dyt_vs_ln.arm,
            extract=dyt_vs_ln.extract,
            render=dyt_vs_ln.render,
            finish=dyt_vs_ln.measure_ln_maps,
            norm_grids=("gpt", "dit"),  # --norm X: X against LayerNorm in the GPT and the DiT
            prepare=ensure_fid_lenet,
        ),
    ]
}
