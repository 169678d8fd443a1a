"""The ``afctl`` command line. Commands live one per module and import lazily."""
