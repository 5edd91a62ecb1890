"""An app module that fails to import: ``--app`` must report it in one line."""

raise RuntimeError("this app is broken on purpose")
