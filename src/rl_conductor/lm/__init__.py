"""The Conductor's language model, apart from training: make a model folder from a short spec
(``models``, ``tokenizer``), load it and generate plans from it (``generate``).

Why its own package: planning (``policies.conductor``), the local worker server and training all
need a model folder and text from it; training builds on this package, and nothing here imports
training, so serving a Conductor never imports the training stack. Importing the package stays
cheap (torch and transformers are imported by the functions that need them).
"""
