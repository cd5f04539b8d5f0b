"""tests/comm helpers (`_commtable`) are imported as top-level modules (import-mode=importlib)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
