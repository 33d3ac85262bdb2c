"""The speed guard (`make bench-guard`): HEAD against the commit bench/baseline names, paired round by round."""
