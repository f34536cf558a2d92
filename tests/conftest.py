import sys
from pathlib import Path

# Make tests/ helpers (data_util, ...) importable as plain modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))
