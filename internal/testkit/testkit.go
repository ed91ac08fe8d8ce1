// Package testkit is what every test package of the module shares,
// whatever it tests: the one poll (Eventually, bounded by Patience).
package testkit
