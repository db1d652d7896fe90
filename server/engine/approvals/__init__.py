"""Approvals: requests, decisions and who may make them, rules and grants, questions, the audit."""
