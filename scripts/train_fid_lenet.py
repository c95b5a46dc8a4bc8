"""Train a LeNet for fid_lenet to measure in (normlab.run.fid_lenet), or find it cached.

    python scripts/train_fid_lenet.py [--epochs 5] [--out FILE] [--force] [overrides ...]

Trains LeNet+BN (ReLU) with normlab's own training into
outputs/fid_lenet/<config hash>-<data checksum>/ unless that file exists (--force: retrain),
and prints its path; --out also copies it to FILE. Extra arguments are train.py overrides.
Runs measure in the committed LeNet (normlab.fid.COMMITTED_FILE) unless told otherwise: a file
trained here is used with callbacks.fid.features=FILE (or =cached, which trains it on first
use), and its values compare only with values measured in the same file.
"""

from normlab.run.fid_lenet import main

if __name__ == "__main__":
    main()
