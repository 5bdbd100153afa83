"""The approval page served by the gateway process at /ui: ``gateway.web.app.build_web_app``."""
