"""``python -m bench.sdk_consumer``: the SDK consumer process of
:mod:`bench.harness.sdk_consumer`, under its former name (``bench/timer_scale.py`` starts it so).
"""

import sys

from bench.harness.sdk_consumer import consumer_main

if __name__ == "__main__":
    sys.exit(consumer_main())
