"""`clustertool play`: YAML playbooks of clustertool commands (load: parse and check; steps: what
a step may be; run: run the checked steps, each as its own clustertool process)."""
