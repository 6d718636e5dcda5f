"""Test support shared by several test packages (not tests themselves)."""
