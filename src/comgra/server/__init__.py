"""The web app: ``comgra --path DIR`` serves a recording in the browser.

``create_app`` builds the Dash app, ``serve`` runs it. The contract for
custom visualizations (``--visualization-file``) is documented in
:mod:`comgra.server.visualization`. Nothing outside ``comgra.cli`` imports
this package, so the recorder never pays for Dash.
"""
from comgra.server.app import create_app, make_http_server, serve

__all__ = ["create_app", "make_http_server", "serve"]
