"""Train the LeNet that fid_lenet measures in (normlab.fid_train), or find it cached.

    python scripts/train_fid_lenet.py [--epochs 5] [--out FILE] [--force] [overrides ...]

Trains LeNet+BN (ReLU) with normlab's own training into
outputs/fid_lenet/<config hash>-<data checksum>/ unless that file exists (--force: retrain),
and prints its path; --out also copies it to FILE. Extra arguments are train.py overrides.
The `fid` callback does the same on first use, so running this first is optional.
"""

from normlab.fid_train import main

if __name__ == "__main__":
    main()
