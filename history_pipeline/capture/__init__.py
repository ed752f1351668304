"""Capture of a live database's history into the WAL (PostgreSQL through logical decoding).

``pgoutput`` decodes replication messages, ``values`` maps PostgreSQL types and text values to the
WAL contract, ``model`` turns decoded transactions into WAL records (all three pure), and
``postgres`` runs the capture loop against a server.
"""
