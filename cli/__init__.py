"""The ``worldserve`` command (cli/main.py): the front door, and the one package that names
every other (the server, its cluster, the model, training, the bench and the clients)."""
