"""Small agent modules that subprocess tests serve with ``sojourn worker --app tests.apps.X``."""
