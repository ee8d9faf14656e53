"""Session-wide test settings: nablax's persistent kernel database goes to a temporary folder,
never the user's cache dir (set before nablax reads its configuration)."""

import os
import tempfile

os.environ.setdefault("NABLAX_CACHE_DIR", tempfile.mkdtemp(prefix="nablax-test-cache-"))
