import sys

from bench.fire_lag.suite import main

sys.exit(main())
