"""One module per screen: picker, checklist, bisection, settings, help."""
