// The program that owns the test programs' precompiled header (tests/CMakeLists.txt): it only
// has to compile, with their flags; its doctest main runs no test.
