"""Where the tests find the checkout, their helpers and their fixture stores, wherever a test
file sits under tests/ (the folders: unit/, features/, durability/, integrations/, cli/,
scripts/, docs/)."""
import os

SUPPORT = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(SUPPORT)
ROOT = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, "data")
