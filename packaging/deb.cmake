# The Debian package (`make deb`: a build with prefix /usr and the config in
# /etc, then `cpack -G DEB`). Dependencies come from dpkg-shlibdeps.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvbroker)
set(CPACK_PACKAGE_VENDOR "kvbroker")
set(CPACK_PACKAGE_CONTACT "kvbroker maintainers <kvbroker@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "per-node KV-cache transfer broker for disaggregated LLM serving")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
  "One broker daemon per node moves KV-cache blocks between the processes
of a disaggregated LLM serving deployment (prefill and decode workers):
workers link libkvbroker and hand transfer descriptors to the broker through
shared-memory rings; the broker copies same-node and bridges to other
nodes' brokers over TCP or RDMA.
.
This package holds the broker (kvbroker, with a systemd unit), kvbctl,
kvbench, kvb-demo, the client library with its header and pkg-config file,
and the Python binding.")
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.org/kvbroker")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# the Python binding (ctypes, standard library only)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "python3")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_STRIP_FILES ON)
# the package's prefix: the build's (a /usr/local build makes a package for
# /usr/local, as tests/service/deb-test.sh does; `make deb` builds for /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
# Debian's per-package documents: copyright and a changelog, gzipped
set(KVB_DEB_DOC ${PROJECT_BINARY_DIR}/deb-doc)
file(MAKE_DIRECTORY ${KVB_DEB_DOC})
configure_file(${CMAKE_CURRENT_LIST_DIR}/copyright.in ${KVB_DEB_DOC}/copyright
  @ONLY)
configure_file(${CMAKE_CURRENT_LIST_DIR}/changelog.in ${KVB_DEB_DOC}/changelog
  @ONLY)
add_custom_command(OUTPUT ${KVB_DEB_DOC}/changelog.gz
  COMMAND gzip -9n -c ${KVB_DEB_DOC}/changelog > ${KVB_DEB_DOC}/changelog.gz
  DEPENDS ${KVB_DEB_DOC}/changelog VERBATIM)
add_custom_target(kvb_deb_doc ALL DEPENDS ${KVB_DEB_DOC}/changelog.gz)
install(FILES ${KVB_DEB_DOC}/copyright ${KVB_DEB_DOC}/changelog.gz
  DESTINATION ${CMAKE_INSTALL_DOCDIR})
# control files: the config in /etc a conffile (dpkg keeps the admin's
# edits), the library cache rebuilt by dpkg's ldconfig trigger, and
# maintainer scripts that only tell systemd about the units (CPack's own
# would call ldconfig, which the trigger replaces)
set(KVB_DEB_CTL ${PROJECT_BINARY_DIR}/deb-control)
file(MAKE_DIRECTORY ${KVB_DEB_CTL})
file(WRITE ${KVB_DEB_CTL}/triggers "activate-noawait ldconfig\n")
foreach(script postinst postrm)
  configure_file(${CMAKE_CURRENT_LIST_DIR}/${script} ${KVB_DEB_CTL}/${script}
    COPYONLY)
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${KVB_DEB_CTL}/${script})
endforeach()
list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${KVB_DEB_CTL}/triggers)
if(IS_ABSOLUTE "${KVB_CONF_DIR}")
  file(WRITE ${KVB_DEB_CTL}/conffiles "${KVB_CONF}\n")
  list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${KVB_DEB_CTL}/conffiles)
  set(CPACK_SET_DESTDIR ON)
endif()
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
