"""Moving a running Synapse here (issue 35): the check (check.py, survey.py, findings.py);
the import comes with the session store's new layout."""
