package main

func runOpenSandbox(c config) error { return nil }
