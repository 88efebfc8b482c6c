"""Basalt's operator side: the ``basalt`` command line (and, later, the admin service).

Command groups live with the code they drive — ``basalt store …`` is built by
:mod:`basalt.store.tools` — and :mod:`basalt.admin.cli` only wires them into one parser.
"""
