"""HTTP layer: connexion app, handlers, gunicorn server."""

import warnings

# connexion 3 imports starlette's test client when it loads, and starlette warns there that
# its test client wants httpx2: no service uses a test client, so the warning only opened
# every service's log (connexion's import is the cause, not ours to change)
warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
