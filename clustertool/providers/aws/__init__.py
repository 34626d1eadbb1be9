"""The ``aws`` provider: same-AZ GPU clusters that come up all or nothing and tear down leaving nothing.

``aws_provider`` holds ``AwsProvider`` (the hooks of providers/base.py); the other modules are
what its verbs load on first use (and so boto3), listed in ``aws_provider``'s docstring.
"""
