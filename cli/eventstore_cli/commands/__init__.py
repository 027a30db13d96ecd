"""The commands of ``eventstore``, one module per family; :mod:`eventstore_cli.app` lists them."""
