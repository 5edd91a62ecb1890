"""``python -m bench`` is ``python -m bench.foundation``."""

from bench.foundation import main

if __name__ == "__main__":
    main()
