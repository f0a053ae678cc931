"""HTTP layer: connexion app, handlers, gunicorn server."""
