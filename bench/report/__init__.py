"""What a bench run becomes: stable figure names, report.md, its tables, the plots, and run-to-run comparison."""
