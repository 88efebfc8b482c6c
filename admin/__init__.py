"""Basalt's operator side: the ``basalt`` command line and the admin service.

mqadmin's operations (:mod:`basalt.admin.ops`, topic writes in :mod:`basalt.admin.topics`)
are run by the ``basalt admin`` verbs (:mod:`basalt.admin.verbs`) and served as the Admin
gRPC API by :mod:`basalt.admin.service` (``basalt admin-service``).

Command groups live with the code they drive — ``basalt store …`` is built by
:mod:`basalt.store.tools` — and :mod:`basalt.admin.cli` only wires them into one parser;
:mod:`basalt.admin.extras` says which extra a command needs where it is not installed.
"""
