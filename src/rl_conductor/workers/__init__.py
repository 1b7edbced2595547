"""Workers: the LLMs a workflow's steps call, behind one protocol (:mod:`.base`), gathered in a pool
(:mod:`.pool`): simulated, replayed, live and fake kinds, and the wrappers around a worker.

Importing the package loads nothing: each kind's dependencies load with its module.
"""
