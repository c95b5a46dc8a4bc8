"""Speed and memory of normlab against its baselines: `python scripts/bench.py [norms|train|all]`
(options: --help). The bench itself is normlab.bench (its docstring tells what each part times)."""

from normlab.bench import main

if __name__ == "__main__":
    main()
